"""A job only "newer" workers know: the test settings do not load this module, so a worker
started without ``JOBGUARD_EXTRA_JOB_MODULES=tests.support.deploy_jobs`` plays a worker still
running the code from before a rolling deploy (tests/integration/test_rolling_deploy.py)."""

from __future__ import annotations

import os

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job

MODULE = __name__


class ShippedInTheNewRelease(Job):
    """Records one JobRun row labelled ``label`` and the pid that ran it."""

    name = "tests.deploy.ShippedInTheNewRelease"

    def __init__(self, label: str):
        self.label = label

    def handle(self):
        now = timezone.now()
        JobRun.objects.create(label=self.label, job_id=self.job_id or "", pid=os.getpid(),
                              attempt=self.attempts(), started_at=now, ended_at=now)


class SendReceipt(Job):
    """The new release's version: ``force`` is new (tests/support/deploy_jobs_old.py has the
    version from before, which does not take it)."""

    name = "tests.deploy.SendReceipt"

    def __init__(self, order: int, force: bool = False):
        self.order, self.force = order, force

    def handle(self):
        now = timezone.now()
        JobRun.objects.create(label=f"new:{self.order}:{self.force}", job_id=self.job_id or "",
                              pid=os.getpid(), attempt=self.attempts(), started_at=now,
                              ended_at=now)
