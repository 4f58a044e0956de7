"""Stopping a real ``jobworker``: the first Ctrl-C says so on stderr with no logging set up
and lets the job finish; a second one stops at once, and the job goes back to the queue with
its attempt unused (not lost, not failed). Repeated SIGTERMs never cut a job off."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from demo.models import JobRun

from django_jobguard.models import FailedJob, QueuedJob
from tests.support import jobs, wait_for
from tests.support.processes import MANAGE, ROOT, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _start(tmp_path) -> tuple[subprocess.Popen, object]:
    log = (tmp_path / "worker.log").open("w+")
    proc = subprocess.Popen([sys.executable, str(MANAGE), "jobworker", "--sleep", "0.2",
                             "--memory", "0"], env=worker_env(), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, text=True)
    return proc, log


def _output(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()


def test_a_second_ctrl_c_stops_at_once_and_the_job_goes_back_unused(tmp_path):
    row = jobs.Record("long", seconds=300).dispatch()
    proc, log = _start(tmp_path)
    try:
        wait_for(lambda: JobRun.objects.filter(label="long").exists(), what="the job running")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "Ctrl-C again to stop at once" in _output(log),
                 what="the shutdown message")
        assert proc.poll() is None  # still running the job
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = _output(log)
    log.close()
    queued = QueuedJob.objects.get(id=row.id)
    assert queued.attempts == 0 and queued.reserved_by in ("", None), output
    assert queued.wait_reason == "its worker was stopped at once (a second Ctrl-C)"
    assert JobRun.objects.get(label="long").ended_at is None  # cut off, not finished
    assert not FailedJob.objects.exists()
    assert "RELEASED" in output and "worker_stop, retry in 0 s" in output


def test_repeated_sigterms_let_the_job_finish(tmp_path):
    jobs.Record("short", seconds=1.5).dispatch()
    proc, log = _start(tmp_path)
    try:
        wait_for(lambda: JobRun.objects.filter(label="short").exists(), what="the job running")
        for _ in range(3):
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = _output(log)
    log.close()
    assert JobRun.objects.get(label="short").ended_at is not None, output
    assert not QueuedJob.objects.exists(), output
    assert "got SIGTERM; finishing the current job." in output
