"""``manage.py jobs_forget <id>``: delete one failed job (``queue:forget``)."""

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = "Delete a failed job."

    def add_arguments(self, parser):
        parser.add_argument("id")

    def handle(self, *args, **opts):
        try:
            operations.forget([opts["id"]], actor="manage.py jobs_forget")
        except (ValueError, operations.FailedJobNotFound):
            raise CommandError(f"No failed job matches {opts['id']}.")
        self.stdout.write(self.style.SUCCESS("Failed job deleted."))
