"""Jobs for chains and batches. Worker subprocesses load this module through
``JOBGUARD_EXTRA_JOB_MODULES``; in-process tests import it."""

from __future__ import annotations

import os
import time

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Batchable, Job
from tests.support.waiting import wait_for_gate

#: Labels whose ``Flaky`` job raises (in-process tests clear it to let a retry succeed;
#: worker subprocesses take them from ``FLOW_FAILING``, comma-separated).
FAILING: set[str] = {label for label in os.environ.get("FLOW_FAILING", "").split(",") if label}


def _record(job: Job, label: str) -> JobRun:
    return JobRun.objects.create(label=label, job_id=job.job_id or "", pid=os.getpid(),
                                 attempt=job.attempts(), started_at=timezone.now())


class Step(Job):
    """Records one JobRun per run; sleeps ``first_run_seconds`` on its first attempt, and
    waits for the ``gate`` file first when one is given."""

    def __init__(self, label: str, first_run_seconds: float = 0.0, gate: str = ""):
        self.label, self.first_run_seconds, self.gate = label, first_run_seconds, gate

    def handle(self):
        run = _record(self, self.label)
        if self.gate:
            wait_for_gate(self.gate)
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


class Grow(Batchable, Job):
    """A batch member that adds ``more`` Step jobs to its own batch."""

    def __init__(self, label: str, more: int):
        self.label, self.more = label, more

    def handle(self):
        _record(self, self.label)
        self.batch.add([Step(f"{self.label}-{i}") for i in range(self.more)])


class CallbackRecord(Batchable, Job):
    """A batch callback: records its label and the batch's counts when it ran."""

    def __init__(self, label: str):
        self.label = label

    def handle(self):
        run = _record(self, self.label)
        batch = self.batch
        run.key = f"{batch.total_jobs}/{batch.pending_jobs}/{batch.failed_jobs}" if batch else ""
        run.save(update_fields=["key"])
