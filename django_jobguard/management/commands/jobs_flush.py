"""``manage.py jobs_flush``: delete all failed jobs (``queue:flush``)."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = "Delete all failed jobs (or those older than --hours)."

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=float, help="Only failed jobs older than this.")

    def handle(self, *args, **opts):
        hours = opts["hours"]
        if hours is not None and hours < 0:
            raise CommandError("--hours must not be negative.")
        deleted = operations.flush(None if hours is None else timedelta(hours=hours),
                                   actor="manage.py jobs_flush")
        self.stdout.write(self.style.SUCCESS(f"{deleted} failed job(s) deleted."))
