"""``manage.py jobs_prune_results [--days N]``: delete old job results (django.tasks results)."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import results
from django_jobguard.conf import jobguard_settings


class Command(BaseCommand):
    help = ("Delete finished job results older than --days (default "
            "JOBGUARD['RESULT_RETENTION_DAYS']), and results whose job was cleared from the "
            "queue. Workers also do this every minute unless RESULT_RETENTION_DAYS is 0.")

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=None,
                            help="Keep results that finished within this many days.")
        parser.add_argument("--database", default="default",
                            help="Database alias holding the results.")

    def handle(self, *args, **opts):
        days = opts["days"]
        if days is None:
            days = jobguard_settings.RESULT_RETENTION_DAYS
            if not days:
                raise CommandError("JOBGUARD['RESULT_RETENTION_DAYS'] is 0 (keep results "
                                   "forever); pass --days to prune anyway.")
        if days < 0:
            raise CommandError("--days must not be negative.")
        deleted = results.prune(older_than=timedelta(days=days), using=opts["database"])
        self.stdout.write(self.style.SUCCESS(f"{deleted} job result(s) deleted."))
