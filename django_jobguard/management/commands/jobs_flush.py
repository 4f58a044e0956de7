"""``manage.py jobs_flush``: delete all failed jobs (``queue:flush``)."""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from django_jobguard.models import FailedJob


class Command(BaseCommand):
    help = "Delete all failed jobs (or those older than --hours)."

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=float, help="Only failed jobs older than this.")

    def handle(self, *args, **opts):
        qs = FailedJob.objects.all()
        if opts["hours"] is not None:
            qs = qs.filter(failed_at__lt=timezone.now() - timedelta(hours=opts["hours"]))
        deleted, _ = qs.delete()
        self.stdout.write(self.style.SUCCESS(f"{deleted} failed job(s) deleted."))
