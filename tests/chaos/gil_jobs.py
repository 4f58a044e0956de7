"""The job of the hard-time-limit test, in a module of its own: its ``timeout = 2`` needs a
``RETRY_AFTER`` above the hard limit (8 s), which the 2 s lease of the other chaos tests'
workers is not (their system checks would refuse to start)."""

from __future__ import annotations

import os

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job


class HoldsTheGil(Job):
    """Runs C code that holds the GIL for about a minute (issue 12 item 2): no signal handler
    and no other thread of its process runs meanwhile, so neither its timeout nor its
    heartbeat can act."""

    tries = 1
    timeout = 2

    def handle(self):
        JobRun.objects.create(label="gil", job_id=self.job_id or "", pid=os.getpid(),
                              attempt=self.attempts(), started_at=timezone.now())
        sum(range(3 * 10**9))
        JobRun.objects.filter(job_id=self.job_id or "").update(ended_at=timezone.now())


class HoldsTheGilAsync(Job):
    """:class:`HoldsTheGil` as an async job: its C code blocks the worker's event loop, so
    neither the cancellation at its timeout nor the heartbeat runs (issue 27 item 2)."""

    tries = 1
    timeout = 2

    async def handle(self):
        await JobRun.objects.acreate(label="gil", job_id=self.job_id or "", pid=os.getpid(),
                                     attempt=self.attempts(), started_at=timezone.now())
        sum(range(3 * 10**9))
        await JobRun.objects.filter(job_id=self.job_id or "").aupdate(ended_at=timezone.now())
