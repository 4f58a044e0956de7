"""``manage.py jobs_failed``: list failed jobs (``queue:failed``)."""

import json

from django_jobguard import registry
from django_jobguard.management import ReadOnlyCommand
from django_jobguard.models import FailedJob


class Command(ReadOnlyCommand):
    help = "List failed jobs, newest first."

    def add_arguments(self, parser):
        parser.add_argument("--queue", help="Only this queue.")
        parser.add_argument("--limit", type=int, default=100, help="At most this many rows.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args, **opts):
        qs = FailedJob.objects.all()
        if opts["queue"]:
            qs = qs.filter(queue=opts["queue"])
        rows = list(qs[: opts["limit"]])
        if opts["json"]:
            self.stdout.write(json.dumps([
                {"id": str(r.id), "queue": r.queue, "name": r.name,
                 "display_name": registry.display_name(r.name, r.payload), "attempts": r.attempts,
                 "exception": r.exception_class, "message": r.message,
                 "failed_at": r.failed_at.isoformat()} for r in rows], indent=2))
            return
        if not rows:
            self.stdout.write("No failed jobs.")
            return
        for r in rows:
            self.stdout.write(f"{r.failed_at:%Y-%m-%d %H:%M:%S}  {r.id}  {r.queue:<10} "
                              f"{registry.display_name(r.name, r.payload)}  "
                              f"{r.exception_class.rsplit('.', 1)[-1]}: {r.message[:80]}")
