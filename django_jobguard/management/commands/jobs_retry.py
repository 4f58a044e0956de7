"""``manage.py jobs_retry <id…|all>``: queue failed jobs again (``queue:retry``)."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from django_jobguard import queue
from django_jobguard.models import FailedJob


class Command(BaseCommand):
    help = "Queue failed jobs again with fresh attempts: ids, or 'all' (optionally --queue)."

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="+", help="Failed job ids, or 'all'.")
        parser.add_argument("--queue", help="With 'all': only failed jobs of this queue.")

    def handle(self, *args, **opts):
        ids = opts["ids"]
        qs = FailedJob.objects.all()
        if ids != ["all"]:
            if "all" in ids:
                raise CommandError("Give either 'all' or ids, not both.")
            try:
                qs = qs.filter(id__in=ids)
                found = {str(i) for i in qs.values_list("id", flat=True)}
            except ValidationError:
                raise CommandError("Failed job ids are UUIDs.")
            missing = [i for i in ids if i not in found]
            if missing:
                raise CommandError(f"No failed job matches {', '.join(missing)}.")
        if opts["queue"]:
            qs = qs.filter(queue=opts["queue"])
        retried = queue.retry_failed(list(qs))
        for job_id in retried:
            self.stdout.write(f"Queued failed job {job_id} again.")
        self.stdout.write(self.style.SUCCESS(f"{len(retried)} job(s) queued again."))
