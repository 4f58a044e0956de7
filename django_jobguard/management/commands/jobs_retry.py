"""``manage.py jobs_retry <id…|all>``: queue failed jobs again (``queue:retry``)."""

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = "Queue failed jobs again with fresh attempts: ids, or 'all' (optionally --queue)."

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="+", help="Failed job ids, or 'all'.")
        parser.add_argument("--queue", help="With 'all': only failed jobs of this queue.")

    def handle(self, *args, **opts):
        ids = opts["ids"]
        if ids != ["all"] and "all" in ids:
            raise CommandError("Give either 'all' or ids, not both.")
        try:
            retried = operations.retry(None if ids == ["all"] else ids,
                                       queue=opts["queue"] or None, actor="manage.py jobs_retry")
        except (ValueError, operations.FailedJobNotFound) as exc:
            raise CommandError(str(exc))
        for job_id in retried:
            self.stdout.write(f"Queued failed job {job_id} again.")
        self.stdout.write(self.style.SUCCESS(f"{len(retried)} job(s) queued again."))
