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


class RealWorker:
    """One ``manage.py jobworker`` process whose output (stdout and stderr) goes to a file."""

    def __init__(self, tmp_path) -> None:
        self.log = (tmp_path / "worker.log").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "jobworker", "--sleep", "0.2", "--memory", "0"],
            env=worker_env(), cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()


@pytest.fixture
def worker(tmp_path):
    started: list[RealWorker] = []

    def start() -> RealWorker:
        started.append(RealWorker(tmp_path))
        return started[-1]

    yield start
    for real in started:
        if real.proc.poll() is None:
            real.proc.kill()
            real.proc.wait()
        real.log.close()


def test_a_second_ctrl_c_stops_at_once_and_the_job_goes_back_unused(worker):
    row = jobs.Record("long", seconds=300).dispatch()
    real = worker()
    wait_for(lambda: JobRun.objects.filter(label="long").exists(), what="the job running")
    real.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C again to stop at once" in real.output(),
             what="the shutdown message")
    assert real.proc.poll() is None  # still running the job
    real.proc.send_signal(signal.SIGINT)
    assert real.proc.wait(timeout=30) == 0
    output = real.output()
    queued = QueuedJob.objects.get(id=row.id)
    assert queued.attempts == 0 and queued.reserved_by in ("", None), output
    assert queued.wait_reason == "its worker was stopped at once (a second Ctrl-C)"
    assert JobRun.objects.get(label="long").ended_at is None  # cut off, not finished
    assert not FailedJob.objects.exists()
    assert "RELEASED" in output and "worker_stop, retry in 0 s" in output


def test_repeated_sigterms_let_the_job_finish(worker, tmp_path):
    # The job waits at a gate opened once the signals were sent: they land while it runs
    # however slow the test process is (1.5 s of sleep was a hope).
    gate = tmp_path / "gate"
    jobs.Record("short", seconds=0.2, gate=str(gate)).dispatch()
    real = worker()
    wait_for(lambda: JobRun.objects.filter(label="short").exists(), what="the job running")
    for _ in range(3):
        real.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "got SIGTERM; finishing the current job." in real.output(),
             what="the shutdown message")
    gate.touch()
    assert real.proc.wait(timeout=30) == 0
    output = real.output()
    assert JobRun.objects.get(label="short").ended_at is not None, output
    assert not QueuedJob.objects.exists(), output
    assert "got SIGTERM; finishing the current job." in output
