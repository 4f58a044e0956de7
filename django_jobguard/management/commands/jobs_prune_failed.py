"""``manage.py jobs_prune_failed --hours 24`` (``queue:prune-failed``)."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_jobguard.models import FailedJob


class Command(BaseCommand):
    help = "Delete failed jobs older than --hours (default 24)."

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=float, default=24)

    def handle(self, *args, **opts):
        if opts["hours"] < 0:
            raise CommandError("--hours must not be negative.")
        cutoff = timezone.now() - timedelta(hours=opts["hours"])
        deleted, _ = FailedJob.objects.filter(failed_at__lt=cutoff).delete()
        self.stdout.write(self.style.SUCCESS(f"{deleted} entries deleted."))
