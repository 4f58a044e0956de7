"""Jobs for the long-jobs tests (debounce, awaiting a result, interrupted runs); worker
subprocesses import this module through tests.settings. Every run writes a ``JobRun`` row
(label, key, attempt), so tests in this process see what worker processes did."""

from __future__ import annotations

import os
import time

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import IterableJob, Job, job
from tests.support.waiting import wait_for_gate


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


class ItemWriter(IterableJob):
    """Iterates over ``count`` numbered items; each writes one ``JobRun`` (label ``item``,
    key = its number) in the transaction of its checkpoint. Every run writes a ``run`` row
    (its attempt) first, and the end a ``finished`` row. ``steal_at``: on that item, the row
    is claimed away from this run inside the item's transaction (a lost lease)."""

    tries = 0  # killed runs spend attempts; the tests count them
    timeout = 0

    def __init__(self, key: str, count: int, seconds: float = 0.0, steal_at: int = -1,
                 max_run_time: float | None = None):
        self.key, self.count, self.seconds = key, count, seconds
        self.steal_at, self.max_run_time = steal_at, max_run_time

    def handle(self) -> object:
        JobRun.objects.create(label="run", key=self.key, job_id=self.job_id or "",
                              pid=os.getpid(), attempt=self.attempts(),
                              started_at=timezone.now())
        return super().handle()

    def items(self, cursor):
        start = 0 if cursor is None else cursor + 1
        return ((i, i) for i in range(start, self.count))

    def total(self) -> int:
        return self.count

    def each(self, item: int) -> None:
        JobRun.objects.create(label="item", key=f"{self.key}:{item}", job_id=self.job_id or "",
                              pid=os.getpid(), attempt=self.attempts(),
                              started_at=timezone.now())
        if item == self.steal_at:
            from django.db.models import F

            from django_jobguard.models import QueuedJob

            QueuedJob.objects.filter(id=self.job_id).update(claims=F("claims") + 1)
        if self.seconds:
            time.sleep(self.seconds)

    def finished(self) -> str:
        JobRun.objects.create(label="finished", key=self.key, job_id=self.job_id or "",
                              pid=os.getpid(), attempt=self.attempts(),
                              started_at=timezone.now())
        return "finished"


class LeaseProbe(IterableJob):
    """Two items. The first lets the row's lease run out inside its transaction, before its
    checkpoint (as it would behind a heartbeat starved past ``RETRY_AFTER``); the second
    records (label ``lease``) whether the row's lease lies in the future again: ``held``
    or ``expired``."""

    tries = 0
    timeout = 0

    def items(self, cursor):
        return ((i, i) for i in range(0 if cursor is None else cursor + 1, 2))

    def each(self, item: int) -> None:
        import datetime

        from django_jobguard.models import QueuedJob

        row = QueuedJob.objects.filter(id=self.job_id)
        if item == 0:
            row.update(available_at=timezone.now() - datetime.timedelta(hours=1))
            return
        held = row.filter(available_at__gt=timezone.now()).exists()
        JobRun.objects.create(label="lease", key="held" if held else "expired",
                              job_id=self.job_id or "", pid=os.getpid(),
                              attempt=self.attempts(), started_at=timezone.now())


class BadCursor(IterableJob):
    tries = 1

    def items(self, cursor):
        yield object(), 1

    def each(self, item) -> None:
        pass


class ThreeSteps(IterableJob):
    """Three named steps, each writing a ``JobRun`` row (label = the step) and sleeping
    ``seconds`` inside its transaction: a SIGKILL lands between the statements of a step.
    With ``gate``, the last step also waits for that file there (the job cannot end before
    the test opens it)."""

    steps = ("fetch", "transform", "load")
    tries = 0
    timeout = 0

    def __init__(self, key: str, seconds: float = 0.0, gate: str = ""):
        self.key, self.seconds, self.gate = key, seconds, gate

    def _write(self, step: str) -> None:
        JobRun.objects.create(label=step, key=self.key, job_id=self.job_id or "",
                              pid=os.getpid(), attempt=self.attempts(),
                              started_at=timezone.now())
        if self.gate and step == self.steps[-1]:
            wait_for_gate(self.gate)
        time.sleep(self.seconds)
        JobRun.objects.filter(label=step, key=self.key).update(ended_at=timezone.now())

    def fetch(self) -> None:
        self._write("fetch")

    def transform(self) -> None:
        self._write("transform")

    def load(self) -> None:
        self._write("load")
