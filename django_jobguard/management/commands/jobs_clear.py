"""``manage.py jobs_clear [--queue a,b] [--noinput]``: delete waiting jobs (``queue:clear``);
asks first at a terminal."""

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations
from django_jobguard.management.prompts import add_noinput_argument, confirmed
from django_jobguard.models import QueuedJob


class Command(BaseCommand):
    help = ("Delete waiting and delayed jobs (running ones finish). Their unique locks are "
            "released too, unless --keep-locks.")

    def add_arguments(self, parser):
        parser.add_argument("--queue", help="Comma-separated queues (default: all).")
        parser.add_argument("--keep-locks", action="store_true",
                            help="Leave unique locks (Laravel's behaviour).")
        add_noinput_argument(parser)

    def handle(self, *args, **opts):
        queues = sorted({q.strip() for q in (opts["queue"] or "").split(",") if q.strip()})
        where = f"the [{', '.join(queues)}] queue(s)" if queues else "all queues"
        rows = QueuedJob.objects.unreserved()
        count = (rows.filter(queue__in=queues) if queues else rows).count()
        if not confirmed(f"This deletes {count} waiting or delayed job(s) from {where}.",
                         opts):
            raise CommandError("Cancelled; nothing was deleted.")
        result = operations.clear(queues or None, keep_locks=opts["keep_locks"],
                                  actor="manage.py jobs_clear")
        if result.locks_released:
            self.stdout.write(f"Released {result.locks_released} unique lock(s).")
        self.stdout.write(self.style.SUCCESS(f"Cleared {result.cleared} job(s) from {where}."))
