"""``manage.py jobs_clear [--queue a,b]``: delete waiting jobs (``queue:clear``)."""

from django.core.management.base import BaseCommand

from django_jobguard import queue, unique
from django_jobguard.models import QueuedJob


class Command(BaseCommand):
    help = ("Delete waiting and delayed jobs (running ones finish). Their unique locks are "
            "released too, unless --keep-locks.")

    def add_arguments(self, parser):
        parser.add_argument("--queue", help="Comma-separated queues (default: all).")
        parser.add_argument("--keep-locks", action="store_true",
                            help="Leave unique locks (Laravel's behaviour).")

    def handle(self, *args, **opts):
        queues = sorted({q.strip() for q in (opts["queue"] or "").split(",") if q.strip()})
        if not opts["keep_locks"]:
            qs = QueuedJob.objects.filter(reserved_at__isnull=True)
            if queues:
                qs = qs.filter(queue__in=queues)
            for payload in qs.filter(payload__has_key="unique").values_list("payload", flat=True):
                unique.release(payload)
        count = queue.clear(queues or None)
        where = f"the [{', '.join(queues)}] queue(s)" if queues else "all queues"
        self.stdout.write(self.style.SUCCESS(f"Cleared {count} job(s) from {where}."))
