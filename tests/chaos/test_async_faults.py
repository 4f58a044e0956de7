"""The fault tests of the other execution modes, for async jobs (``--async-concurrency``):
kill -9, ``pg_terminate_backend``, a Redis restart and a lease taken over by another worker
(issue 27). The hard time limit of an async job is tested in test_hard_time_limit.py. Each
runs a few dozen jobs of ``tests.support.async_jobs.AsyncRecord`` or ``tests.chaos.jobs``
through real worker processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from demo.models import JobRun

from django_jobguard import aio, dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from tests.chaos import jobs as chaos_jobs
from tests.chaos.conftest import (
    LONG_LEASE,
    Outcome,
    chaos_env,
    stop_and_read,
    stopped,
    terminate_backends,
)
from tests.chaos.test_redis_restart import assert_unique_jobs_outlived_the_restart
from tests.support import MANAGE, ROOT, async_jobs, requires_postgres, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ASYNC = ("--async-concurrency", "5", "--sleep", "0.2")


def _records(label: str, n: int, seconds: float) -> list:
    return dispatch_many([async_jobs.AsyncRecord(label, key=str(i), seconds=seconds)
                          for i in range(n)])


def test_kill_9_async_workers_loses_no_job(fleet):
    total, kills = 60, 2
    handles = _records("async-kill", total, 0.2)
    workers = fleet(*ASYNC, "--tries", "5", env=chaos_env(**LONG_LEASE))
    workers.start(2)
    workers.kill_as_it_goes("async-kill", total, kills)
    workers.finish()

    out = Outcome.read((h.id for h in handles), "async-kill")
    assert out.queued == 0
    assert out.completed == out.ids and not out.failed  # five tries outlast two kills
    out.assert_only_kills_repeat(workers.killed)


APP = "jobguard-chaos-async"


@requires_postgres
def test_async_jobs_reconnect_after_their_connections_are_terminated(fleet):
    """The job's own async ORM calls run on asgiref's thread-sensitive thread: once its
    connection was cut, every later async job used to fail with "the connection is closed"
    until the worker was restarted (issue 27 item 1)."""
    before = _records("pg-before", 20, 0.3)
    workers = fleet(*ASYNC, "--tries", "3", env=chaos_env(PGAPPNAME=APP, **LONG_LEASE))
    [proc] = workers.start(1)
    wait_for(lambda: JobRun.objects.filter(label="pg-before", ended_at__isnull=False).count()
             >= 5, timeout=60)
    assert terminate_backends(APP) >= 3  # jobs in flight: main, heartbeat, the async ORM's ...
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=120)
    # The async ORM's connection is idle now, and still the one that was cut unless the
    # worker closed it: cut it again, then the jobs after it.
    terminate_backends(APP)
    after = _records("pg-after", 20, 0.05)
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=120)
    assert proc.poll() is None, workers.errors()
    assert workers.stop_all() == [0], workers.errors()

    assert not FailedJob.objects.exists(), [f.message for f in FailedJob.objects.all()]
    first = Outcome.read((h.id for h in before), "pg-before")
    assert first.completed == first.ids  # those cut mid-run ran again, to their end
    later = Outcome.read((h.id for h in after), "pg-after")
    assert later.completed == later.ids
    # The job that met the async ORM's cut connection failed at its first query, before
    # recording anything, and ran again on a new one: no run of a later job was cut short.
    assert all(run["ended_at"] is not None for runs in later.runs.values() for run in runs)
    # A job ran twice only where its ack met a cut connection of the loop's pool (each of
    # its threads at most once): at-least-once, the lease brought it back.
    twice = [job_id for job_id, runs in later.runs.items() if len(runs) > 1]
    assert len(twice) <= aio.POOL_SIZE and all(len(later.runs[j]) == 2 for j in twice)
    assert set(later.runs) == later.ids


@pytest.mark.skipif(os.environ.get("JOBGUARD_CHAOS_REDIS_RESTART") != "1",
                    reason="restarts a redis-server: set JOBGUARD_CHAOS_REDIS_RESTART=1")
@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
def test_redis_restart_under_async_unique_jobs_loses_no_job(fleet, private_redis, tmp_path):
    total = 60
    # The second half waits at a gate opened once Redis is down (see restart_midway).
    gate = tmp_path / "gate"
    handles = dispatch_many([chaos_jobs.AsyncUniqueRecord(str(i), str(gate) if i >= total // 2
                                                          else "") for i in range(total)])
    assert all(handles)
    workers = fleet(*ASYNC, env=chaos_env(JOBGUARD_REDIS_URL=private_redis.url,
                                          JOBGUARD_STORE="redis", **LONG_LEASE))
    procs = workers.start(2)
    private_redis.restart_midway("async-unique", total, finished_meanwhile=5, gate=gate)
    assert_unique_jobs_outlived_the_restart(workers, procs, handles, "async-unique")
    assert all(dispatch_many([chaos_jobs.AsyncUniqueRecord(str(i)) for i in range(total)]))


def _start(log, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(MANAGE), "jobworker", *ASYNC, *args],
                            env=chaos_env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            text=True)


def test_an_async_job_whose_lease_was_taken_over_changes_nothing_when_it_ends(tmp_path):
    """A worker stalled (SIGSTOP) past its lease loses its async job to another worker; when
    it resumes, its run ends and its ack finds the row no longer its own (LOST): the job has
    one outcome, the new worker's."""
    # The run waits at a gate opened once its worker is stopped: it is still running then
    # however slow the test process (1.5 s alone was a hope: it could end, acked, first).
    gate = tmp_path / "gate"
    job = chaos_jobs.AsyncUntimed("takeover", seconds=1.5, gate=str(gate)).dispatch()
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(2)]  # noqa: SIM115
    first = _start(logs[0])
    second = None
    try:
        wait_for(lambda: JobRun.objects.filter(label="takeover", pid=first.pid).exists(),
                 timeout=60)
        first.send_signal(signal.SIGSTOP)  # stalled: no heartbeat renews the 2 s lease
        wait_for(lambda: stopped(first.pid), timeout=10, interval=0.01,
                 what="the first worker stopped")
        gate.touch()
        second = _start(logs[1])
        wait_for(lambda: JobRun.objects.filter(label="takeover", pid=second.pid).exists(),
                 timeout=60)
        first.send_signal(signal.SIGCONT)
        wait_for(lambda: not QueuedJob.objects.exists()
                 and JobRun.objects.filter(label="takeover", ended_at__isnull=True).count()
                 == 0, timeout=60)
    finally:
        outputs = stop_and_read((first, second), logs)
    assert first.returncode == 0 and second.returncode == 0, outputs
    runs = list(JobRun.objects.filter(label="takeover").order_by("started_at"))
    assert [r.pid for r in runs] == [first.pid, second.pid]
    assert runs[1].attempt > runs[0].attempt  # the takeover counted an attempt
    assert f"[{job.id}]" in outputs[0] and "LOST" in outputs[0], outputs[0]
    assert not FailedJob.objects.exists() and not QueuedJob.objects.exists()
