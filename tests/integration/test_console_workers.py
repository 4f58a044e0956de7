"""Quiet and stop a live ``jobworker`` from the console (issue 31), with a real process: the
command goes through the worker's row and its heartbeat (2 s here: RETRY_AFTER 6). Quieted,
it claims nothing more while its running job finishes; stopped, it exits 0."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import dispatch, operations
from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from tests.support import jobs, wait_for
from tests.support.processes import worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_quiet_then_stop_a_live_worker(workers, tmp_path):
    # The long job waits at a gate opened once the worker is quiet and a job waits behind it:
    # it runs to its end while quieted, however slow the machine (3 s of sleep against a
    # heartbeat of 2 s was a hope).
    gate = tmp_path / "gate"
    dispatch(jobs.Record("long", seconds=0.2, gate=str(gate)), queue="console")
    pool = workers(1, "--queue", "console", "--sleep", "0.2", "--max-time", "120",
                   env=worker_env(JOBGUARD_RETRY_AFTER="6", JOBGUARD_DEFAULT_TIMEOUT="5"))
    wait_for(lambda: JobRun.objects.filter(label="long").exists(), what="the long job started")
    worker_id = WorkerRow.objects.get().id
    assert operations.command_worker(worker_id, "quiet", actor="test") == "quiet"
    wait_for(lambda: WorkerRow.objects.get(id=worker_id).state == "quiet", timeout=20,
             what="the worker saw the quiet at its heartbeat")
    later = dispatch(jobs.Record("later"), queue="console").id
    assert JobRun.objects.get(label="long").ended_at is None  # quieted while it runs
    gate.touch()
    wait_for(lambda: JobRun.objects.get(label="long").ended_at is not None, timeout=20,
             what="the running job finished")
    # Two more heartbeats after the job ended: a claim would have happened by then.
    seen = WorkerRow.objects.get(id=worker_id).last_seen_at
    wait_for(lambda: WorkerRow.objects.get(id=worker_id).last_seen_at > seen, timeout=20,
             what="a heartbeat")
    seen = WorkerRow.objects.get(id=worker_id).last_seen_at
    wait_for(lambda: WorkerRow.objects.get(id=worker_id).last_seen_at > seen, timeout=20,
             what="another heartbeat")
    assert not JobRun.objects.filter(label="later").exists()
    row = QueuedJob.objects.get(id=later)
    assert (row.reserved_by, row.attempts) == ("", 0)
    assert not QueuedJob.objects.filter(reserved_by=worker_id).exists()
    long_run = JobRun.objects.get(label="long")
    assert long_run.attempt == 1  # it ran once, to its end

    assert operations.command_worker(worker_id, "stop", actor="test") == "stop"
    out = pool.wait(30)[0]  # asserts exit code 0
    assert "was quieted" in out and "was asked to stop" in out
    assert not WorkerRow.objects.filter(id=worker_id).exists()  # it deregistered
    assert QueuedJob.objects.get(id=later).attempts == 0  # still waiting, untouched
