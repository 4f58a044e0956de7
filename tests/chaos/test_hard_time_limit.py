"""The hard time limit (issue 12 item 2): a job inside C code that holds the GIL runs no
signal handler, so its SIGALRM timeout cannot fire and its heartbeat thread cannot renew its
lease. It used to run for 48 s with ``timeout=2`` while a second worker took the job when the
lease ran out. The watchdog process now kills its worker at timeout + grace + margin (8 s),
before the lease (12 s here) runs out, and the job's policy decides what comes next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from demo.models import JobRun

from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.worker.timeouts import hard_limit
from tests.chaos.conftest import chaos_env, stop_and_read
from tests.chaos.gil_jobs import HoldsTheGil, HoldsTheGilAsync
from tests.support import MANAGE, ROOT, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE = 12


def start_worker(log, *args: str) -> subprocess.Popen:
    env = chaos_env(JOBGUARD_RETRY_AFTER=str(LEASE), JOBGUARD_DEFAULT_TIMEOUT="2",
                    JOBGUARD_EXTRA_JOB_MODULES="tests.chaos.gil_jobs")
    return subprocess.Popen([sys.executable, str(MANAGE), "jobworker", "--sleep", "0.2", *args],
                            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def watchdogs_of(pid: int) -> list[int]:
    """Pids of the watchdog processes watching ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"watchdog.py") for a in args) and str(pid).encode() in args:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("mode", ["1", "3", "async"])
def test_a_job_holding_the_gil_is_killed_at_its_hard_limit_and_never_copied(mode):
    """With --threads the job's thread holds the GIL, so the coordinator cannot give it up:
    the watchdog, armed by that thread as the job started, kills the process. An async job
    holding it blocks the worker's event loop (its timeout cancels nothing): the watchdog,
    armed as its run started on the loop, kills the process too (issue 27 item 2)."""
    job_class = HoldsTheGilAsync if mode == "async" else HoldsTheGil
    assert hard_limit(job_class.timeout) < LEASE
    job = job_class().dispatch()
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(2)]  # noqa: SIM115
    first = start_worker(logs[0], *(("--async-concurrency", "2") if mode == "async"
                                    else ("--threads", mode)))
    second = None
    try:
        wait_for(lambda: JobRun.objects.filter(label="gil").exists(), timeout=60)
        started = time.monotonic()
        watchdog = watchdogs_of(first.pid)
        assert len(watchdog) == 1
        second = start_worker(logs[1])  # idle: takes the job once its lease runs out
        # The first worker is killed by its watchdog (it would run ~48 s otherwise).
        assert first.wait(timeout=45) == -signal.SIGKILL
        killed_after = time.monotonic() - started
        wait_for(lambda: not watchdogs_of(first.pid), timeout=10)  # the watchdog ended too
        # The second worker finds the lease run out and the job's one try used: failed.
        wait_for(lambda: FailedJob.objects.filter(id=job.id).exists(), timeout=60)
        assert second.poll() is None  # and goes on
    finally:
        outputs = stop_and_read((first, second), logs)
    assert "hard time limit" in outputs[0] and f"killing worker pid {first.pid}" in outputs[0]
    assert killed_after < LEASE, f"killed {killed_after:.1f} s after the job started"
    runs = list(JobRun.objects.filter(label="gil"))
    assert [r.pid for r in runs] == [first.pid], "a second copy of the job was started"
    failed = FailedJob.objects.get(id=job.id)
    assert failed.exception_class.endswith("MaxAttemptsExceededError")
    assert "1 of 1 tries used" in failed.message, failed.message
    assert not QueuedJob.objects.exists()
