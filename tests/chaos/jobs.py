"""Jobs for the fault-injection tests (worker subprocesses load them via
JOBGUARD_EXTRA_JOB_MODULES=tests.chaos.jobs)."""

from __future__ import annotations

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job
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
