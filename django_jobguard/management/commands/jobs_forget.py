"""``manage.py jobs_forget <id>``: delete one failed job (``queue:forget``)."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from django_jobguard.models import FailedJob


class Command(BaseCommand):
    help = "Delete a failed job."

    def add_arguments(self, parser):
        parser.add_argument("id")

    def handle(self, *args, **opts):
        try:
            deleted, _ = FailedJob.objects.filter(id=opts["id"]).delete()
        except ValidationError:
            deleted = 0
        if not deleted:
            raise CommandError(f"No failed job matches {opts['id']}.")
        self.stdout.write(self.style.SUCCESS("Failed job deleted."))
