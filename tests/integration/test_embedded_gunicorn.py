"""``EMBEDDED_WORKER`` under a real gunicorn with 2 worker processes: each starts its worker
thread (``embedded.start()`` in the WSGI module, the documented way to start at boot), jobs
run in the web server's processes, and SIGTERM to gunicorn lets the running job finish
before the processes exit (nothing left queued, both workers deregistered). A management
command with the same settings starts no thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from demo.models import JobRun

from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from tests.support import jobs, wait_for
from tests.support.processes import ROOT, run_command, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SETTINGS = """
from tests.settings import *  # noqa: F403
ALLOWED_HOSTS = ["*"]
JOBGUARD = {**JOBGUARD, "EMBEDDED_WORKER": {  # noqa: F405
    "threads": 1, "queues": ["*"], "sleep": 0.2, "shutdown_timeout": 20}}
"""
WSGI = """
from django.core.wsgi import get_wsgi_application

from django_jobguard.worker import embedded

application = get_wsgi_application()
embedded.start()
"""


@pytest.fixture
def env(tmp_path):
    (tmp_path / "embedded_settings.py").write_text(SETTINGS)
    (tmp_path / "embedded_wsgi.py").write_text(WSGI)
    return worker_env(DJANGO_SETTINGS_MODULE="embedded_settings", PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(ROOT), str(ROOT / "testproject")]))


def test_gunicorn_runs_jobs_in_its_workers_and_drains_them_on_sigterm(env, tmp_path):
    log = (tmp_path / "gunicorn.log").open("w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "embedded_wsgi:application", "--workers", "2",
         "--bind", f"unix:{tmp_path / 'web.sock'}", "--graceful-timeout", "30"],
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        def pids():
            assert server.poll() is None, "gunicorn exited"
            found = list(WorkerRow.objects.values_list("pid", flat=True))
            return found if len(found) == 2 else None

        rows = wait_for(pids, timeout=60,
                        what="an embedded worker in each of gunicorn's 2 processes")
        assert len(set(rows)) == 2 and server.pid not in rows  # the workers, not the master

        jobs.Record("quick").dispatch()
        wait_for(lambda: JobRun.objects.filter(label="quick", ended_at__isnull=False).exists(),
                 what="a job run by the web server's process")
        # The slow job waits at a gate opened only once its process is exiting: it is still
        # running when the shutdown begins, however slow the machine (2 s of sleep was a hope).
        gate = tmp_path / "gate"
        jobs.Record("slow", seconds=0.2, gate=str(gate)).dispatch()
        running = wait_for(lambda: JobRun.objects.filter(label="slow").first(),
                           what="the slow job running")

        server.send_signal(signal.SIGTERM)
        exiting = f"Worker exiting (pid: {running.pid})"
        wait_for(lambda: exiting in (tmp_path / "gunicorn.log").read_text(),
                 what="the slow job's process exiting")
        gate.touch()
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.seek(0)
        output = log.read()
        log.close()
    slow = JobRun.objects.get(label="slow")
    assert slow.ended_at is not None, output  # finished during the shutdown, not cut off
    assert slow.pid in rows
    assert not QueuedJob.objects.exists(), output
    assert not WorkerRow.objects.exists(), output


def test_a_management_command_starts_no_embedded_worker(env):
    result = run_command("shell", "-c", "import threading, time; time.sleep(0.5); "
                         "print(sorted(t.name for t in threading.enumerate()))", env=env)
    assert result.returncode == 0, result.stderr
    assert "MainThread" in result.stdout and "jobguard-embedded" not in result.stdout
