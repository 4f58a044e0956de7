"""``manage.py jobs_resume QUEUE``: workers claim from a paused queue again."""

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = "Resume a paused queue (listening workers wake at once, others at their next poll)."

    def add_arguments(self, parser):
        parser.add_argument("queue", help="The queue to resume.")

    def handle(self, *args, **opts):
        try:
            operations.resume(opts["queue"], actor="manage.py jobs_resume")
        except operations.QueueNameError as exc:
            raise CommandError(str(exc))
        self.stdout.write(self.style.SUCCESS(f"Resumed queue {opts['queue'].strip()!r}."))
