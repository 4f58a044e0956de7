"""Jobs for chains and batches. Worker subprocesses load this module through
``JOBGUARD_EXTRA_JOB_MODULES``; in-process tests import it."""

from __future__ import annotations

import os
import time

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job

#: Labels whose ``Flaky`` job raises (in-process tests clear it to let a retry succeed).
FAILING: set[str] = set()


def _record(job: Job, label: str) -> JobRun:
    return JobRun.objects.create(label=label, job_id=job.job_id or "", pid=os.getpid(),
                                 attempt=job.attempts(), started_at=timezone.now())


class Step(Job):
    """Records one JobRun per run; sleeps ``first_run_seconds`` on its first attempt."""

    def __init__(self, label: str, first_run_seconds: float = 0.0):
        self.label, self.first_run_seconds = label, first_run_seconds

    def handle(self):
        run = _record(self, self.label)
        if self.first_run_seconds and self.attempts() == 1:
            time.sleep(self.first_run_seconds)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])
        return self.label


class Flaky(Job):
    """Fails (no retries) while its label is in :data:`FAILING`."""

    def __init__(self, label: str):
        self.label = label

    def handle(self):
        _record(self, self.label)
        if self.label in FAILING:
            raise RuntimeError(f"{self.label} failed")
