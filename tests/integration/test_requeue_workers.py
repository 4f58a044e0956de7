"""Requeueing the reservation of a worker killed with SIGKILL, with real ``jobworker``
processes: the job is flagged stale and its worker gone at once (its process is gone from
this host), "requeue now" puts it back without waiting for the lease, and a live worker's
job is never requeued under it."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import dispatch, operations
from django_jobguard.models import QueuedJob, Worker
from tests.support import jobs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def started(label: str, pid: int | None = None) -> JobRun | None:
    runs = JobRun.objects.filter(label=label)
    return (runs.filter(pid=pid) if pid else runs).first()


def test_a_killed_workers_job_is_flagged_and_requeued_but_a_live_ones_is_not(workers):
    orphan = dispatch(jobs.Cooperative("orphan", steps=1200, seconds=0.1))
    args = ("--sleep", "0.2", "--tries", "3", "--max-time", "150")
    doomed = workers(1, *args)
    first = wait_for(lambda: started("orphan"), timeout=60, what="the first run")
    row = QueuedJob.objects.with_state().get(id=orphan.id)
    assert row.state == "reserved" and row.reserved_by
    assert operations.requeue([orphan.id]).alive == [str(orphan.id)]  # its worker lives

    doomed.procs[0].kill()  # SIGKILL: no clean-up, the row stays reserved, the lease runs
    doomed.procs[0].wait()
    assert first.pid == doomed.procs[0].pid
    dead = row.reserved_by
    assert Worker.objects.filter(id=dead).exists()  # its row stays until housekeeping
    assert operations.worker_states([dead]) == {dead: "ended"}
    assert operations.stale_reservations(QueuedJob.objects.with_state()) == {
        str(orphan.id): f"worker {dead} is gone"}
    assert QueuedJob.objects.with_state().get(id=orphan.id).state == "reserved"  # the lease

    # A live worker busy with another job: that job is never requeued under it.
    busy = dispatch(jobs.Cooperative("busy", steps=1200, seconds=0.1))
    helper = workers(1, *args, "--stop-when-empty")
    wait_for(lambda: started("busy"), timeout=60, what="the live worker's job")
    with pytest.raises(operations.RequeueRefused, match="which is alive"):
        operations.requeue_job(str(busy.id))

    assert operations.requeue([orphan.id], actor="test").requeued == [str(orphan.id)]
    assert QueuedJob.objects.with_state().get(id=orphan.id).state == "waiting"
    assert operations.cancel_job(str(busy.id)) == operations.STOPPING
    # The live worker takes the requeued job next, long before the lease would have run out.
    second = wait_for(lambda: started("orphan", helper.procs[0].pid), timeout=60,
                      what="the requeued job running on the live worker")
    assert second.job_id == str(orphan.id)
    assert QueuedJob.objects.get(id=orphan.id).attempts == 2  # the killed run counted
    assert operations.cancel_job(str(orphan.id)) == operations.STOPPING
    output = "".join(helper.wait(90))
    assert f"[{orphan.id}]" in output and not QueuedJob.objects.exists()
