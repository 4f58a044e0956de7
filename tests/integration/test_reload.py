"""``jobworker --reload`` with real processes: a change to a job module while a job runs lets
the job finish, then the worker restarts on the new code; a job still running after the grace
period goes back without using an attempt and the new worker runs it; a child that cannot
start (a syntax error) starts again once the file is fixed. Each test writes its job module
to a temporary directory and edits it as a developer would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from demo.models import JobRun

from django_jobguard import Job
from django_jobguard.models import FailedJob, QueuedJob
from tests.support import wait_for
from tests.support.processes import MANAGE, ROOT, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JOB_MODULE = '''
import os
import time

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job

VERSION = "{version}"


class Probe(Job):
    name = "reload_probe.Probe"

    def __init__(self, label, flag=""):
        self.label, self.flag = label, flag

    def handle(self):
        run = JobRun.objects.create(label=self.label, key=VERSION, pid=os.getpid(),
                                    attempt=self.context.attempt, started_at=timezone.now())
        while self.flag and not os.path.exists(self.flag):
            time.sleep(0.05)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])
'''


class Probe(Job):
    """The test's side of the job: dispatched here, run by the worker's own (edited) class."""

    name = "reload_probe.Probe"

    def __init__(self, label: str, flag: str = "") -> None:
        self.label, self.flag = label, flag

    def handle(self) -> None:
        raise AssertionError("runs in the worker, from the module the test writes")


class ReloadingWorker:
    """``manage.py jobworker --reload`` on a job module in ``directory``."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.directory = directory
        (directory / "reload_settings.py").write_text(
            "from tests.settings import *  # noqa: F403\n"
            "JOBGUARD = {**JOBGUARD, 'JOB_MODULES': [*JOBGUARD['JOB_MODULES'], "  # noqa: F405
            "'reload_probe']}\n")
        self.write_module(version="v1")
        self.log = (directory / "worker.log").open("w+")
        env = worker_env(DJANGO_SETTINGS_MODULE="reload_settings",
                         PYTHONPATH=os.pathsep.join([str(directory), str(ROOT)]))
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "jobworker", "--reload", "--sleep", "0.2",
             "--memory", "0", *args],
            env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)  # its own process group, as in a terminal

    def write_module(self, *, version: str, text: str | None = None) -> None:
        """Write the job module; its modification time moves on by at least a second, so
        the change is seen whatever the file system's time resolution."""
        path = self.directory / "reload_probe.py"
        before = path.stat().st_mtime if path.exists() else 0
        path.write_text(text if text is not None
                        else textwrap.dedent(JOB_MODULE).format(version=version))
        stamp = max(path.stat().st_mtime, before + 1)
        os.utime(path, (stamp, stamp))

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.directory / "worker.log").read_text()

    def wait_output(self, text: str, *, count: int = 1) -> None:
        wait_for(lambda: self.output().count(text) >= count, timeout=60,
                 what=f"{text!r} in the worker's output")

    def stop(self, *, ctrl_c: bool = False) -> int:
        """SIGTERM to the parent, or SIGINT to the parent and the child, as Ctrl-C in a
        terminal sends it to the whole foreground process group."""
        if ctrl_c:
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("jobworker --reload did not exit after SIGTERM:\n"
                                 + self.output()) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture
def reloading(tmp_path, scratch_jobs):
    started: list[ReloadingWorker] = []

    def start(*args: str) -> ReloadingWorker:
        worker = ReloadingWorker(tmp_path, *args)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
            try:
                worker.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        worker.log.close()


def _run(label: str) -> JobRun | None:
    return JobRun.objects.filter(label=label).order_by("id").last()


def test_a_change_lets_the_running_job_finish_then_the_worker_runs_the_new_code(
        reloading, tmp_path):
    go = tmp_path / "go"
    Probe("first", flag=str(go)).dispatch()
    worker = reloading()
    first = wait_for(lambda: _run("first"), what="the first job running")

    worker.write_module(version="v2")
    worker.wait_output("reload_probe.py changed; restarting the worker after the running job")
    assert _run("first").ended_at is None  # still running: the change did not stop it
    go.touch()
    wait_for(lambda: _run("first").ended_at, what="the first job finishing")

    Probe("second").dispatch()
    second = wait_for(lambda: _run("second"), what="the second job run by the new worker")
    assert worker.stop() == 0

    assert JobRun.objects.filter(label="first").count() == 1  # ran once, not again
    assert (first.key, first.attempt) == ("v1", 1)
    assert (second.key, second.attempt) == ("v2", 1)  # the new code
    assert second.pid != first.pid  # in a new process
    assert not QueuedJob.objects.exists()
    assert not FailedJob.objects.exists()


def test_a_job_running_past_the_grace_period_goes_back_and_runs_again_on_the_new_code(
        reloading, tmp_path):
    go = tmp_path / "go"
    Probe("stuck", flag=str(go)).dispatch()
    worker = reloading("--reload-grace", "0.5")
    wait_for(lambda: _run("stuck"), what="the job running")

    worker.write_module(version="v2")
    wait_for(lambda: JobRun.objects.filter(label="stuck", key="v2").exists(), timeout=60,
             what="the job running again in the restarted worker")
    go.touch()
    wait_for(lambda: JobRun.objects.filter(label="stuck", ended_at__isnull=False).exists(),
             what="the job finishing")
    wait_for(lambda: not QueuedJob.objects.exists(), what="the queue empty")
    assert worker.stop() == 0

    runs = list(JobRun.objects.order_by("id").values_list("key", "attempt", "ended_at"))
    assert [(key, attempt) for key, attempt, _ in runs] == [("v1", 1), ("v2", 1)]
    assert runs[0][2] is None and runs[1][2] is not None  # interrupted, then finished
    assert not FailedJob.objects.exists()  # tries=1: a counted attempt would have failed it
    assert "RELEASED" in worker.output() and "worker_restart" in worker.output()


def test_a_worker_that_cannot_start_starts_again_once_the_code_is_fixed(reloading):
    worker = reloading()
    Probe("before").dispatch()
    wait_for(lambda: _run("before"), what="the first worker running a job")

    worker.write_module(version="broken", text="def broken(:\n")
    worker.wait_output("starts again when a file changes")
    assert worker.proc.poll() is None  # the parent waits for a fix
    worker.write_module(version="v3")
    Probe("after").dispatch()
    after = wait_for(lambda: _run("after"), timeout=60, what="a job run after the fix")
    assert worker.stop(ctrl_c=True) == 0
    assert after.key == "v3"
    assert "SyntaxError" in worker.output()
