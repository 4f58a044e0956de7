"""``manage.py jobs_prune_results [--days N]``: delete old job results (django.tasks results)."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = ("Delete finished job results older than --days (default "
            "JOBGUARD['RESULT_RETENTION_DAYS']), and results whose job was cleared from the "
            "queue. Workers also do this every minute unless RESULT_RETENTION_DAYS is 0.")

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=None,
                            help="Keep results that finished within this many days.")
        parser.add_argument("--database", default=None,
                            help="Database alias holding the results "
                                 "(default: JOBGUARD['DATABASE']).")

    def handle(self, *args, **opts):
        days = opts["days"]
        if days is None:
            retention = operations.result_retention()
            if retention is None:
                raise CommandError("JOBGUARD['RESULT_RETENTION_DAYS'] is 0 (keep results "
                                   "forever); pass --days to prune anyway.")
        elif days < 0:
            raise CommandError("--days must not be negative.")
        else:
            retention = timedelta(days=days)
        deleted = operations.prune_results(retention, actor="manage.py jobs_prune_results",
                                           using=opts["database"])
        self.stdout.write(self.style.SUCCESS(f"{deleted} job result(s) deleted."))
