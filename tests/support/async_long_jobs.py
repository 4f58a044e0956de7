"""Async test jobs with timeouts longer than the short leases (``RETRY_AFTER`` 2 s) of the
chaos and integration workers: in their own module so that system check E003 does not stop
every such worker. Worker subprocesses that run them load it through
``JOBGUARD_EXTRA_JOB_MODULES=tests.support.async_long_jobs``."""

from __future__ import annotations

import asyncio
import os

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job, WithoutOverlapping
from tests.support.async_jobs import SEEN
from tests.support.waiting import await_gate


class AsyncRenewed(Job):
    """Holds a WithoutOverlapping lock whose ttl (1 s) is shorter than the job (the ``gate``
    file awaited when given, then ``seconds``), renewed while it awaits."""

    timeout = 30

    def __init__(self, label: str, seconds: float = 3.0, gate: str = ""):
        self.label, self.seconds, self.gate = label, seconds, gate
        if gate:
            self.timeout = 0  # held at the gate, it must not time out while the test looks

    def middleware(self):
        return [WithoutOverlapping("renewed", expire_after=1, renew=True, release_after=0.2)]

    async def handle(self):
        run = await JobRun.objects.acreate(label=self.label, key="renewed", pid=os.getpid(),
                                           job_id=self.job_id or "", token=self.lock_token,
                                           started_at=timezone.now())
        if self.gate:
            await await_gate(self.gate)
        await asyncio.sleep(self.seconds)
        run.ended_at = timezone.now()
        await run.asave(update_fields=["ended_at"])


class AsyncCancelsItself(Job):
    """Asks (as an operator would) for its own cancel, then awaits: the cancel ends its task."""

    timeout = 30

    async def handle(self):
        from asgiref.sync import sync_to_async

        from django_jobguard import operations

        SEEN.append(("cancel", await sync_to_async(operations.cancel_job)(self.job_id)))
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            SEEN.append(("task cancelled", self.cancelled))
            raise
