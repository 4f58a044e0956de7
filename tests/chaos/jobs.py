"""Jobs for the fault-injection tests (worker subprocesses load them via
JOBGUARD_EXTRA_JOB_MODULES=tests.chaos.jobs)."""

from __future__ import annotations

import os
import time

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job, ShouldBeUnique
from django_jobguard.stores import get_store


class TakeLock(Job):
    """Tries to take ``key`` for ``ttl`` seconds in the default store; records what happened
    and the clock of the worker process (skewed in the clock-skew tests)."""

    def __init__(self, key: str, ttl: float):
        self.key, self.ttl = key, ttl

    def handle(self):
        token = get_store().acquire(self.key, f"job:{self.job_id}", ttl=self.ttl,
                                    job_id=self.job_id or "")
        JobRun.objects.create(label="acquired" if token is not None else "refused",
                              key=self.key, job_id=self.job_id or "", token=token,
                              started_at=timezone.now())


class UniqueRecord(ShouldBeUnique, Job):
    """A unique job (one per ``key``, lock in the default store) that records its runs."""

    tries = 5

    def __init__(self, key: str):
        self.key = key

    def unique_id(self) -> str:
        return self.key

    def handle(self):
        run = JobRun.objects.create(label="unique", key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    started_at=timezone.now())
        time.sleep(0.01)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])
