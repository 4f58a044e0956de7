"""``EMBEDDED_WORKER`` in this process: what starts the threads and what does not, the
threads running real jobs on the committed test database, stopping them, and the settings
check. The gunicorn test (tests/integration/test_embedded_gunicorn.py) runs a real server."""

from __future__ import annotations

import threading

import pytest
from demo.models import JobRun
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.test.client import ClientHandler

from django_jobguard.checks import check_settings
from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.worker import embedded
from tests.support import jobs, wait_for

CONFIG = {"threads": 2, "queues": ["*"], "sleep": 0.1, "shutdown_timeout": 10}


def _embedded_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("jobguard-embedded")]


@pytest.fixture
def outside_tests(monkeypatch):
    """Pretend the test environment is not set up (what a server process looks like)."""
    monkeypatch.setattr(embedded, "in_tests", lambda: False)
    yield
    assert embedded.stop(10)


def test_nothing_starts_when_it_is_off_or_in_tests(settings):
    assert embedded.start() is None  # off by default
    settings.JOBGUARD = {**settings.JOBGUARD, "EMBEDDED_WORKER": CONFIG}
    assert embedded.in_tests()
    assert embedded.start() is None
    embedded.on_request_started(sender=WSGIHandler)
    assert _embedded_threads() == []


@pytest.mark.django_db(transaction=True)
def test_a_servers_first_request_starts_the_threads_and_they_run_jobs(settings, outside_tests):
    settings.JOBGUARD = {**settings.JOBGUARD, "EMBEDDED_WORKER": CONFIG}
    embedded.on_request_started(sender=ClientHandler)  # the test client is not a server
    assert _embedded_threads() == []

    embedded.on_request_started(sender=WSGIHandler)
    embedded.on_request_started(sender=ASGIHandler)  # once per process
    assert sorted(_embedded_threads()) == ["jobguard-embedded-1", "jobguard-embedded-2"]
    wait_for(lambda: WorkerRow.objects.count() == 2, what="two embedded workers registered")

    jobs.Record("default queue").dispatch()
    jobs.Record("mail queue").dispatch(queue="mail")  # "*": every queue
    wait_for(lambda: JobRun.objects.filter(ended_at__isnull=False).count() == 2,
             what="both jobs run by the embedded threads")
    wait_for(lambda: not QueuedJob.objects.exists(), what="both rows acked")

    assert embedded.stop(10) is True
    assert _embedded_threads() == []
    assert not WorkerRow.objects.exists()  # they deregistered


@pytest.mark.django_db(transaction=True)
def test_stop_waits_for_the_running_job(settings, outside_tests, tmp_path):
    settings.JOBGUARD = {**settings.JOBGUARD, "EMBEDDED_WORKER": {**CONFIG, "threads": 1}}
    # The job waits at a gate opened once the stop was asked for: it still runs then however
    # slow the test is (1 s of sleep was a hope: a job done before stop() checked nothing).
    gate = tmp_path / "gate"
    jobs.Record("slow", seconds=0.2, gate=str(gate)).dispatch()
    started = embedded.start()
    wait_for(lambda: JobRun.objects.filter(label="slow").exists(), what="the job running")
    stopped: list[bool] = []
    stopping = threading.Thread(target=lambda: stopped.append(embedded.stop(30)))
    stopping.start()
    wait_for(lambda: started.workers[0].run_state == "stopping", what="the stop asked for")
    gate.touch()
    stopping.join(60)
    assert stopped == [True]
    run = JobRun.objects.get(label="slow")
    assert run.ended_at is not None  # finished, not cut off
    assert not QueuedJob.objects.exists()


@pytest.mark.parametrize(("config", "problem"), [
    ({"threads": 0}, "'threads' must be an int >= 1"),
    ({"threads": "2"}, "'threads' must be an int >= 1"),
    ({"workers": 2}, "unknown key 'workers'"),
    ({"queues": "default"}, "'queues' must be a non-empty list"),
    ({"queues": ["a,b"]}, "'queues' must be a non-empty list"),
    ({"sleep": -1}, "'sleep' must be a number of seconds >= 0"),
    ({"shutdown_timeout": "soon"}, "'shutdown_timeout' must be a number"),
    ({"tries": -1}, "'tries' must be an int >= 0"),
])
def test_a_bad_embedded_worker_setting_is_an_error_naming_it(settings, config, problem):
    settings.JOBGUARD = {**settings.JOBGUARD, "EMBEDDED_WORKER": config}
    errors = [e for e in check_settings() if e.id == "jobguard.E080"]
    assert len(errors) == 1 and problem in errors[0].msg, errors


def test_a_good_embedded_worker_setting_passes_the_check(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "EMBEDDED_WORKER": CONFIG}
    assert [e for e in check_settings() if e.id.startswith("jobguard.E08")] == []
    settings.JOBGUARD = {**settings.JOBGUARD, "EMBEDDED_WORKER": []}
    assert any(e.id == "jobguard.E002" for e in check_settings())
