"""``manage.py jobs_prune_failed --hours 24`` (``queue:prune-failed``)."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = "Delete failed jobs older than --hours (default 24)."

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=float, default=24)

    def handle(self, *args, **opts):
        if opts["hours"] < 0:
            raise CommandError("--hours must not be negative.")
        deleted = operations.prune_failed(timedelta(hours=opts["hours"]),
                                          actor="manage.py jobs_prune_failed")
        self.stdout.write(self.style.SUCCESS(f"{deleted} entries deleted."))
