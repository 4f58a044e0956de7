"""Async jobs used by the tests (issue 13). Worker subprocesses import this module through
tests.settings."""

from __future__ import annotations

import asyncio
import os
import time

from demo.models import JobRun, Profile
from django.utils import timezone

from django_jobguard import Job, job
from tests.support.jobs import Record
from tests.support.waiting import await_gate

# What in-process tests inspect.
SEEN: list[tuple] = []


class AsyncRecord(Record):
    """:class:`~tests.support.jobs.Record` through the async ORM: records one JobRun per run,
    awaiting ``seconds`` in between (and the ``gate`` file first when one is given, with no
    time limit then; ``gate_after`` as there)."""

    async def handle(self):
        run = await JobRun.objects.acreate(
            label=self.label, key=self.key, job_id=self.job_id or "", pid=os.getpid(),
            attempt=self.attempts(), token=self.lock_token, started_at=timezone.now())
        if self.gate and (not self.gate_after or await JobRun.objects.filter(
                label=self.label, ended_at__isnull=False).acount() >= self.gate_after):
            await await_gate(self.gate)
        if self.seconds:
            await asyncio.sleep(self.seconds)
        run.ended_at = timezone.now()
        await run.asave(update_fields=["ended_at"])
        return self.label


class AsyncRename(Job):
    """Reads a profile with ``aget`` and renames it with ``asave``."""

    def __init__(self, profile_id: int, name: str):
        self.profile_id, self.name_to = profile_id, name

    async def handle(self):
        profile = await Profile.objects.aget(pk=self.profile_id)
        profile.name = self.name_to
        profile.syncs += 1
        await profile.asave()
        return await Profile.objects.filter(name=self.name_to).acount()


@job(keep_result=True)
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


class AsyncSlow(Job):
    """Awaits ``seconds``; ``timeout`` cancels it. Records how it ended in SEEN / JobRun."""

    timeout = 1
    tries = 2

    def __init__(self, seconds: float = 30.0, label: str = "slow"):
        self.seconds, self.label = seconds, label

    async def handle(self):
        run = await JobRun.objects.acreate(label=self.label, pid=os.getpid(),
                                           attempt=self.attempts(), started_at=timezone.now())
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            SEEN.append(("cancelled", self.label, self.attempts()))
            run.key = "cancelled"
            await asyncio.shield(run.asave(update_fields=["key"]))
            raise
        return "finished"


class AsyncSlowOnce(AsyncSlow):
    timeout = 1
    tries = 1


class AsyncBlocker(Job):
    """Blocks the event loop with time.sleep() (the mistake the worker warns about)."""

    timeout = 0

    def __init__(self, seconds: float = 2.0):
        self.seconds = seconds

    async def handle(self):
        time.sleep(self.seconds)  # wrong on purpose


class SyncOnlyMiddleware:
    """A user's middleware with only a sync handle(): it uses the sync ORM around next()."""

    def handle(self, job, next):
        JobRun.objects.create(label=f"{job.label}:before", started_at=timezone.now())
        result = next(job)
        JobRun.objects.create(label=f"{job.label}:after:{result}", started_at=timezone.now())
        return result


class AsyncWrapped(AsyncRecord):
    """An AsyncRecord wrapped by SyncOnlyMiddleware."""

    def middleware(self):
        return [SyncOnlyMiddleware()]


class AsyncContextProbe(Job):
    """:class:`tests.support.jobs.ContextProbe` as an async job (its run on the event loop)."""

    def __init__(self, label: str):
        self.label = label

    async def handle(self):
        from tests.support.jobs import context_seen

        await asyncio.sleep(0)
        await JobRun.objects.acreate(label=self.label, key=context_seen(),
                                     job_id=self.job_id or "", pid=os.getpid(),
                                     started_at=timezone.now())
