"""Jobs for the long-jobs tests (debounce, awaiting a result, interrupted runs); worker
subprocesses import this module through tests.settings. Every run writes a ``JobRun`` row
(label, key, attempt), so tests in this process see what worker processes did."""

from __future__ import annotations

import os
import time

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job, job


class DebouncedRecord(Job):
    """Debounced per ``key``; records its run with ``value`` as the run's label."""

    debounce = (1, 60)

    def __init__(self, key: str, value: str):
        self.key, self.value = key, value

    def debounce_id(self) -> str:
        return self.key

    def handle(self) -> str:
        JobRun.objects.create(label=self.value, key=f"debounced:{self.key}",
                              job_id=self.job_id or "", pid=os.getpid(),
                              attempt=self.attempts(), started_at=timezone.now())
        return self.value


class Sleeper(Job):
    """Sleeps ``seconds`` (in short steps), records each run; keeps its result."""

    keep_result = True
    tries = 1

    def __init__(self, key: str, seconds: float = 0.0, value: object = None):
        self.key, self.seconds, self.value = key, seconds, value

    def handle(self) -> object:
        run = JobRun.objects.create(label="sleeper", key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    started_at=timezone.now())
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            time.sleep(0.02)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])
        return self.value


@job(debounce=(1, 60), debounce_key=lambda user_id, text: user_id)
def debounced_note(user_id: int, text: str) -> str:
    """A debounced function job, per user."""
    return text


class FailsWithResult(Job):
    """Keeps its result and fails at once."""

    keep_result = True
    tries = 1

    def handle(self) -> None:
        raise ValueError("no invoice 7")
