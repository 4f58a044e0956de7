"""``manage.py jobs_pause QUEUE [--force]``: workers stop claiming from a queue."""

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = ("Pause a queue: no worker claims its jobs until jobs_resume (running jobs finish). "
            "Persisted in the database.")

    def add_arguments(self, parser):
        parser.add_argument("queue", help="The queue to pause.")
        parser.add_argument("--force", action="store_true",
                            help="Pause a queue nothing uses yet (ahead of time).")

    def handle(self, *args, **opts):
        try:
            paused = operations.pause(opts["queue"], force=opts["force"],
                                      actor="manage.py jobs_pause", force_hint="pass --force")
        except operations.QueueNameError as exc:
            raise CommandError(str(exc))
        name = opts["queue"].strip()
        if paused:
            self.stdout.write(self.style.SUCCESS(f"Paused queue {name!r}."))
        else:
            self.stdout.write(f"Queue {name!r} was paused already.")
