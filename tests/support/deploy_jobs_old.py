"""The release before tests/support/deploy_jobs.py: ``SendReceipt`` under the same name, but
its constructor does not take ``force`` yet. A worker started with
``JOBGUARD_EXTRA_JOB_MODULES=tests.support.deploy_jobs_old`` plays a worker still running the
old code of a rolling deploy (tests/integration/test_rolling_deploy.py)."""

from __future__ import annotations

import os

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job

MODULE = __name__


class SendReceipt(Job):
    """The old version: takes only ``order``."""

    name = "tests.deploy.SendReceipt"

    def __init__(self, order: int):
        self.order = order

    def handle(self):
        now = timezone.now()
        JobRun.objects.create(label=f"old:{self.order}", job_id=self.job_id or "",
                              pid=os.getpid(), attempt=self.attempts(), started_at=now,
                              ended_at=now)
