"""Cancel and progress with a real ``jobworker``: the running job's progress shows on its row
while it runs; a cancel makes it stop at its next ``self.cancelled`` check and end as
cancelled (row gone, no failed job), and the worker goes on with the next job."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import dispatch, operations
from django_jobguard.models import FailedJob, QueuedJob
from tests.support import jobs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_running_job_reports_progress_then_stops_when_cancelled(workers):
    running = dispatch(jobs.Cooperative("long", steps=600, seconds=0.1))
    dispatch(jobs.Cooperative("after", steps=1, seconds=0))
    pool = workers(1, "--sleep", "0.2", "--stop-when-empty", "--max-time", "120")
    row = wait_for(lambda: QueuedJob.objects.filter(id=running.id, progress__gt=0).first(),
                   what="progress on the running job's row")
    assert row.progress_message.startswith("step ")
    assert operations.cancel_job(str(running.id)) == operations.STOPPING
    output = "".join(pool.wait(60))
    run = JobRun.objects.get(label="long")
    assert run.key == "cancelled" and run.ended_at is not None
    assert JobRun.objects.get(label="after").key == "finished"
    assert not QueuedJob.objects.exists()
    assert not FailedJob.objects.exists()
    assert f"[{running.id}]" in output and "CANCELLED" in output
