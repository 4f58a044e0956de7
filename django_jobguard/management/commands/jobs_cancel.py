"""``manage.py jobs_cancel ID [ID ...]``: delete waiting jobs, ask running ones to stop."""

import uuid

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = ("Cancel queued jobs: a job no worker holds is deleted (its unique lock freed); a "
            "running job is asked to stop (job.cancelled) and ends as cancelled.")

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="+", help="Queued job ids.")

    def handle(self, *args, **opts):
        errors = []
        for raw in opts["ids"]:
            try:
                job_id = str(uuid.UUID(raw))
            except ValueError:
                errors.append(f"{raw!r} is not a job id (a UUID).")
                continue
            try:
                done = operations.cancel_job(job_id, actor="manage.py jobs_cancel")
            except operations.JobNotQueuedError as exc:
                errors.append(str(exc))
                continue
            if done == operations.DELETED:
                self.stdout.write(f"Deleted job {job_id}.")
            else:
                self.stdout.write(f"Asked running job {job_id} to stop.")
        if errors:
            raise CommandError("\n".join(errors))
