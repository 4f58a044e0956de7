"""``manage.py jobs_requeue <id…>`` or ``jobs_requeue --stale``: put jobs reserved by a
worker that is gone back on the queue now (owner-checked: never a live worker's job)."""

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations
from django_jobguard.models import QueuedJob

ACTOR = "manage.py jobs_requeue"


class Command(BaseCommand):
    help = ("Requeue jobs whose worker is gone (killed, or no heartbeat for RETRY_AFTER): ids, "
            "or --stale for every such job. A job held by a live worker is refused.")

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="*", help="Queued job ids.")
        parser.add_argument("--stale", action="store_true",
                            help="Every reservation whose worker is gone.")

    def handle(self, *args, **opts):
        if bool(opts["ids"]) == opts["stale"]:
            raise CommandError("Give job ids or --stale (not both).")
        if opts["stale"]:
            stale = operations.stale_reservations(QueuedJob.objects.reserved().with_state())
            result = operations.requeue(sorted(stale), actor=ACTOR)
        else:
            result = operations.requeue(opts["ids"], actor=ACTOR)
        for job_id in result.requeued:
            self.stdout.write(f"Requeued {job_id}.")
        problems = [f"{job_id}: held by a live worker (cancel it instead)"
                    for job_id in result.alive]
        problems += [f"{job_id}: not reserved by any worker" for job_id in result.not_reserved]
        self.stdout.write(self.style.SUCCESS(f"{len(result.requeued)} job(s) requeued."))
        if problems:
            raise CommandError("Not requeued: " + "; ".join(problems) + ".")
