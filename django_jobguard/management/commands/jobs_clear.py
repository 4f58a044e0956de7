"""``manage.py jobs_clear [--queue a,b]``: delete waiting jobs (``queue:clear``)."""

from django.core.management.base import BaseCommand

from django_jobguard import operations


class Command(BaseCommand):
    help = ("Delete waiting and delayed jobs (running ones finish). Their unique locks are "
            "released too, unless --keep-locks.")

    def add_arguments(self, parser):
        parser.add_argument("--queue", help="Comma-separated queues (default: all).")
        parser.add_argument("--keep-locks", action="store_true",
                            help="Leave unique locks (Laravel's behaviour).")

    def handle(self, *args, **opts):
        queues = sorted({q.strip() for q in (opts["queue"] or "").split(",") if q.strip()})
        result = operations.clear(queues or None, keep_locks=opts["keep_locks"],
                                  actor="manage.py jobs_clear")
        if result.locks_released:
            self.stdout.write(f"Released {result.locks_released} unique lock(s).")
        where = f"the [{', '.join(queues)}] queue(s)" if queues else "all queues"
        self.stdout.write(self.style.SUCCESS(f"Cleared {result.cleared} job(s) from {where}."))
