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


class LongLoop(Job):
    """Runs ``steps`` steps of 50 ms, recording each run (label ``loop``, its attempt) and,
    when it ends, ``done``. ``cooperative``: it checks ``self.stopping`` between steps and
    hands itself back with ``self.interrupt()``; otherwise only ``--stop-timeout`` ends it.
    Retries are not expected: ``tries = 2`` and a long backoff would show a spent attempt."""

    tries = 2
    backoff = [600]

    def __init__(self, key: str, steps: int = 10_000, cooperative: bool = True):
        self.key, self.steps, self.cooperative = key, steps, cooperative

    def handle(self) -> None:
        run = JobRun.objects.create(label="loop", key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    started_at=timezone.now())
        for _ in range(self.steps):
            if self.cooperative and self.stopping:
                run.label = "interrupted"
                run.save(update_fields=["label"])
                return self.interrupt()
            time.sleep(0.05)
        run.label = "done"
        run.ended_at = timezone.now()
        run.save(update_fields=["label", "ended_at"])
        return None


class AsyncLongLoop(Job):
    """:class:`LongLoop` (not cooperative) as an async job."""

    tries = 2
    backoff = [600]

    def __init__(self, key: str):
        self.key = key

    async def handle(self) -> None:
        import asyncio

        from asgiref.sync import sync_to_async

        await sync_to_async(JobRun.objects.create)(
            label="loop", key=self.key, job_id=self.job_id or "", pid=os.getpid(),
            attempt=self.attempts(), started_at=timezone.now())
        await asyncio.sleep(3600)
