"""Real worker processes against the real test database: nothing lost, nothing run twice."""

from __future__ import annotations

import signal

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from tests.support import POSTGRES, jobs, requires_postgres, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_each_job_runs_exactly_once_across_workers(workers):
    total, processes = (2000, 4) if POSTGRES else (400, 2)
    dispatch_many([jobs.Record("bulk", key=str(i)) for i in range(total)])
    outputs = workers(processes, "--stop-when-empty", "--sleep", "0.1", "--batch", "5").wait(240)
    runs = list(JobRun.objects.values_list("job_id", "pid"))
    assert len(runs) == total
    assert len({job_id for job_id, _ in runs}) == total  # none twice
    assert not QueuedJob.objects.exists()  # none lost or left reserved
    assert not FailedJob.objects.exists()
    assert sum(out.count(" DONE ") for out in outputs) == total
    assert not WorkerRow.objects.exists()  # workers deregistered on exit


def test_sigterm_finishes_the_current_job_then_exits_zero(workers, tmp_path):
    # The slow job waits at a gate opened only once the SIGTERM was sent, so the signal lands
    # while it runs however slow the test process is (1.5 s of sleep was a hope).
    gate = tmp_path / "gate"
    jobs.Record("slow", seconds=0.2, gate=str(gate)).dispatch()
    jobs.Record("after").dispatch()
    pool = workers(1, "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(label="slow").exists())
    pool.procs[0].send_signal(signal.SIGTERM)
    gate.touch()
    pool.wait(30)
    run = JobRun.objects.get(label="slow")
    assert run.ended_at is not None  # it finished its job
    assert not JobRun.objects.filter(label="after").exists()  # and took no new one
    row = QueuedJob.objects.get()
    assert row.reserved_at is None and row.attempts == 0


def test_timeout_kills_only_the_job_and_the_worker_goes_on(workers):
    jobs.Slow(30).dispatch()
    jobs.Record("next").dispatch()
    out = workers(1, "--stop-when-empty", "--sleep", "0").wait(60)[0]
    assert "JobTimeoutError" in QueuedJob.objects.get().last_error
    assert JobRun.objects.filter(label="next").exists()
    assert " RELEASED " in out and " DONE " in out


def test_concurrency_runs_several_processes_under_one_supervisor(workers):
    dispatch_many([jobs.Record("sup", key=str(i), seconds=0.05) for i in range(60)])
    workers(1, "--concurrency", "2", "--stop-when-empty", "--sleep", "0.1").wait(120)
    assert JobRun.objects.count() == 60
    assert JobRun.objects.values("job_id").distinct().count() == 60
    assert not QueuedJob.objects.exists()


def test_killed_worker_job_is_recovered_after_retry_after(workers):
    env_retry = {"JOBGUARD_RETRY_AFTER": "2", "JOBGUARD_DEFAULT_TIMEOUT": "1"}
    from tests.support import worker_env

    jobs.Record("victim", seconds=60).dispatch()
    pool = workers(1, "--sleep", "0.1", "--timeout", "0", env=worker_env(**env_retry))
    wait_for(lambda: JobRun.objects.filter(label="victim").exists())
    pool.procs[0].send_signal(signal.SIGKILL)
    pool.procs[0].wait()
    row = QueuedJob.objects.get()
    assert row.reserved_at is not None and row.attempts == 1
    QueuedJob.objects.update(payload={"args": ["victim-again"], "kwargs": {}})
    out = workers(1, "--max-jobs", "1", "--sleep", "0.2", "--tries", "2",
                  env=worker_env(**env_retry))
    wait_for(lambda: JobRun.objects.filter(label="victim-again").exists(), timeout=30)
    out.wait(30)
    assert JobRun.objects.get(label="victim-again").attempt == 2


@requires_postgres
def test_notify_wakes_an_idle_worker_before_its_sleep(workers):
    pool = workers(1, "--sleep", "60", "--max-jobs", "1")
    # LISTEN starts right after the worker registers and before its first claim, so a job
    # dispatched from here on is either claimed at once or wakes the idle wait.
    wait_for(lambda: WorkerRow.objects.exists())
    jobs.Record("woken").dispatch()
    pool.wait(20)  # would take 60 s with polling alone
    assert JobRun.objects.filter(label="woken").exists()
