"""Requeueing the reservation of a worker killed with SIGKILL, with real ``jobworker``
processes: the job is flagged stale and its worker gone at once (its process is gone from
this host), "requeue now" puts it back without waiting for the lease, and a live worker's
job is never requeued under it."""

from __future__ import annotations

import signal

import pytest
from demo.models import JobRun
from rest_framework.test import APIClient

from django_jobguard import dispatch, operations
from django_jobguard.models import FailedJob, QueuedJob, Worker
from tests.support import jobs, wait_for, worker_env

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


def test_a_stopped_worker_whose_row_was_deleted_registers_again_and_keeps_its_job(
        workers, admin_user):
    """Issue 27 (3): a worker stopped (SIGSTOP) for longer than the housekeeping limit has
    its Worker row deleted by another worker's housekeeping. Resumed (SIGCONT) in the middle
    of its job, it registers again at its next heartbeat; its job is not requeued under it
    (the API answers 409), not run a second time and not failed."""
    # RETRY_AFTER 5 s: housekeeping (each worker's, once a minute) deletes the row of a worker
    # silent for 50 s. No timeout: a stopped job's time limit would run out while stopped.
    env = worker_env(JOBGUARD_RETRY_AFTER="5", JOBGUARD_DEFAULT_TIMEOUT="0")
    job = dispatch(jobs.Cooperative("long", steps=120, seconds=0.1), queue="long")
    stopped = workers(1, "--queue", "long", "--tries", "1", "--sleep", "0.2",
                      "--stop-when-empty", env=env)
    proc = stopped.procs[0]
    wait_for(lambda: started("long", proc.pid), timeout=60, what="the long job running")
    worker_id = QueuedJob.objects.get(id=job.id).reserved_by
    assert Worker.objects.filter(id=worker_id).exists()

    proc.send_signal(signal.SIGSTOP)
    try:
        # Another worker, on another queue (so that it does not claim the job once its lease
        # runs out), whose housekeeping deletes the silent worker's row.
        other = workers(1, "--queue", "elsewhere", "--sleep", "0.2", env=env)
        wait_for(lambda: not Worker.objects.filter(id=worker_id).exists(), timeout=150,
                 interval=0.5, what="housekeeping deleting the stopped worker's row")
        assert QueuedJob.objects.get(id=job.id).reserved_by == worker_id
    finally:
        proc.send_signal(signal.SIGCONT)

    wait_for(lambda: Worker.objects.filter(id=worker_id).exists(), timeout=60,
             what="the resumed worker registering again")
    api = APIClient()
    api.force_authenticate(admin_user)
    response = api.post(f"/jobguard/api/jobs/{job.id}/requeue/")
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "worker_alive"
    assert operations.requeue([job.id]).alive == [str(job.id)]

    stopped.wait(120)
    other.procs[0].send_signal(signal.SIGTERM)
    other.wait(60)
    runs = list(JobRun.objects.filter(label="long").values_list("pid", "key"))
    assert runs == [(proc.pid, "finished")]  # one run, to its end, on the resumed worker
    assert not FailedJob.objects.exists() and not QueuedJob.objects.exists()
