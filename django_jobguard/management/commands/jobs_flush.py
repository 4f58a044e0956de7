"""``manage.py jobs_flush [--noinput]``: delete all failed jobs (``queue:flush``); asks first
at a terminal."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations
from django_jobguard.management.prompts import add_noinput_argument, confirmed


class Command(BaseCommand):
    help = "Delete all failed jobs (or those older than --hours)."

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=float, help="Only failed jobs older than this.")
        add_noinput_argument(parser)

    def handle(self, *args, **opts):
        hours = opts["hours"]
        if hours is not None and hours < 0:
            raise CommandError("--hours must not be negative.")
        age = None if hours is None else timedelta(hours=hours)
        count = operations.failed_before(age, "default").count()
        if not confirmed(f"This deletes {count} failed job(s) for good.", opts):
            raise CommandError("Cancelled; nothing was deleted.")
        deleted = operations.flush(age, actor="manage.py jobs_flush")
        self.stdout.write(self.style.SUCCESS(f"{deleted} failed job(s) deleted."))
