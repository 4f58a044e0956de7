"""Prometheus metrics: the counters a worker records for each outcome, the database gauges
of the scrape view and who may read it, and the clear error without prometheus_client."""

from __future__ import annotations

import datetime
import sys

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from django_jobguard.checks import check_settings
from django_jobguard.metrics import MetricsUnavailableError, require
from django_jobguard.metrics.recording import start_recording, stop_recording
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from django_jobguard.testing import drain
from tests.support import jobs

pytestmark = pytest.mark.django_db
TOKEN = "s3cret-token-for-prometheus"
URL = "/jobguard/metrics/"


@pytest.fixture
def registry():
    registry = CollectorRegistry()
    start_recording(registry)
    yield registry
    stop_recording()


def count(registry, job: str, outcome: str, queue: str = "default") -> float:
    return registry.get_sample_value("jobguard_jobs_total", {
        "queue": queue, "job": f"tests.support.jobs.{job}", "outcome": outcome}) or 0.0


def test_counters_move_with_each_outcome(registry):
    jobs.Noop(1).dispatch()
    jobs.Noop(2).dispatch()
    jobs.FailMe().dispatch()
    jobs.ReleaseMe().dispatch()  # tries=2: released twice, then failed (out of attempts)
    drain()
    assert count(registry, "Noop", "done") == 2
    assert count(registry, "FailMe", "failed") == 1
    assert count(registry, "ReleaseMe", "released") == 2
    assert count(registry, "ReleaseMe", "failed") == 1
    timed = {"queue": "default", "job": "tests.support.jobs.Noop"}
    assert registry.get_sample_value("jobguard_job_duration_seconds_count", timed) == 2
    assert registry.get_sample_value("jobguard_job_duration_seconds_bucket",
                                     {**timed, "le": "+Inf"}) == 2
    # Releases are counted, not timed (their time is a lock check's, not a run's).
    assert registry.get_sample_value("jobguard_job_duration_seconds_count", {
        "queue": "default", "job": "tests.support.jobs.ReleaseMe"}) == 1


def test_nothing_is_recorded_unless_asked():
    jobs.Noop(1).dispatch()
    drain()  # no recorder: nothing registered, nothing raised
    from django_jobguard import observe

    assert observe.recorders() == ()


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get(URL, **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples}


def test_the_view_reports_queues_failed_jobs_locks_and_circuits_from_the_database(client):
    old = jobs.Noop(1).dispatch()
    jobs.Noop(2).dispatch()
    jobs.Noop(3).dispatch(queue="mail", delay=600)
    QueuedJob.objects.filter(id=old.id).update(
        available_at=timezone.now() - datetime.timedelta(seconds=120))
    FailedJob.objects.create(name="tests.support.jobs.Boom", queue="mail", payload={},
                             exception_class="builtins.RuntimeError", message="x")
    store = get_store("database")
    store.acquire("jobguard:unique:tests.Noop:1", "owner-1", ttl=60)
    store.acquire("jobguard:overlap:tests.Noop:2", "owner-2", ttl=60)
    store.acquire("jobguard:overlap:tests.Noop:3", "owner-3", ttl=60)
    store.circuit_enter("jobguard:circuit:sms", owner="w", max_attempts=1, decay=60,
                        probe_lease=10)
    store.circuit_leave("jobguard:circuit:sms", owner="w", outcome="failure", max_attempts=1,
                        decay=60)
    with override_settings(JOBGUARD={"METRICS_TOKEN": TOKEN}):
        got = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert got[("jobguard_queue_jobs", (("queue", "default"), ("state", "waiting")))] == 2
    assert got[("jobguard_queue_jobs", (("queue", "mail"), ("state", "delayed")))] == 1
    assert got[("jobguard_queue_jobs", (("queue", "mail"), ("state", "waiting")))] == 0
    assert got[("jobguard_failed_jobs", (("queue", "mail"),))] == 1
    age = got[("jobguard_queue_oldest_waiting_seconds", (("queue", "default"),))]
    assert 120 <= age < 600
    assert ("jobguard_queue_oldest_waiting_seconds", (("queue", "mail"),)) not in got
    assert got[("jobguard_locks_held", (("kind", "unique"), ("store", "database")))] == 1
    assert got[("jobguard_locks_held", (("kind", "overlap"), ("store", "database")))] == 2
    assert got[("jobguard_circuits_open", (("store", "database"),))] == 1
    assert got[("jobguard_store_up", (("store", "database"),))] == 1
    assert got[("jobguard_workers", ())] == 0


def test_anonymous_gets_401_with_a_bearer_challenge(client):
    response = client.get(URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="jobguard metrics"'
    with override_settings(JOBGUARD={"METRICS_TOKEN": TOKEN}):
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong-token-xxxxxxxx"
                          ).status_code == 401


def test_staff_need_the_view_permission(client):
    user = User.objects.create_user("ann", password="pw", is_staff=True)
    client.force_login(user)
    response = client.get(URL)
    assert response.status_code == 403
    assert b"django_jobguard.view_queuedjob" in response.content
    user.user_permissions.add(Permission.objects.get(codename="view_queuedjob"))
    client.force_login(User.objects.get(pk=user.pk))
    scrape(client)


def test_a_short_token_is_a_configuration_error():
    with override_settings(JOBGUARD={"METRICS_TOKEN": "short"}):
        assert [e.id for e in check_settings()] == ["jobguard.E130"]
    with override_settings(JOBGUARD={"METRICS_TOKEN": 42}):
        assert [e.id for e in check_settings()] == ["jobguard.E002"]
    with override_settings(JOBGUARD={"METRICS_TOKEN": TOKEN}):
        assert check_settings() == []


def test_without_prometheus_client_the_option_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    with pytest.raises(MetricsUnavailableError, match=r"pip install 'django-jobguard\[metrics\]'"):
        require()
    with pytest.raises(CommandError, match=r"--metrics-port: .*django-jobguard\[metrics\]"):
        call_command("jobworker", "--once", "--metrics-port", "9100")


def test_the_worker_does_not_import_prometheus_client_unless_asked():
    import subprocess

    from tests.support.processes import ROOT, worker_env

    code = ("import django, sys; django.setup(); "
            "import django_jobguard.management.commands.jobworker, django_jobguard.worker, "
            "django_jobguard.metrics.urls; "
            "print('prometheus_client' in sys.modules)")
    env = worker_env()
    env["PYTHONPATH"] = f"{ROOT / 'testproject'}:{env['PYTHONPATH']}"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_a_port_in_use_is_a_clear_error():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=rf"--metrics-port {port}: .*in use"):
            call_command("jobworker", "--once", "--metrics-port", str(port),
                         "--metrics-address", "127.0.0.1")


def test_lock_gauges_read_each_store(client, store_alias):
    store = get_store(store_alias)
    store.acquire("jobguard:unique:tests.Noop:9", "owner-9", ttl=60)
    store.acquire("jobguard:unique:tests.Noop:gone", "owner-0", ttl=0.001)  # expires at once
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_queuedjob"))
    client.force_login(user)
    from tests.support import wait_for

    wait_for(lambda: store.get_lock("jobguard:unique:tests.Noop:gone") is None, timeout=5,
             interval=0.002, what="the short lock expired")
    got = scrape(client)
    assert got[("jobguard_locks_held", (("kind", "unique"), ("store", store_alias)))] == 1
    assert got[("jobguard_store_up", (("store", store_alias),))] == 1


def test_a_store_that_cannot_be_read_is_reported_down_not_a_failed_scrape(client, monkeypatch):
    from django_jobguard.stores.database import DatabaseStore

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("store is down")

    monkeypatch.setattr(DatabaseStore, "locks", unreachable)
    jobs.Noop(1).dispatch()
    with override_settings(JOBGUARD={"METRICS_TOKEN": TOKEN}):
        got = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert got[("jobguard_store_up", (("store", "database"),))] == 0
    assert not [key for key in got if key[0] == "jobguard_locks_held"
                and ("store", "database") in key[1]]
    assert got[("jobguard_queue_jobs", (("queue", "default"), ("state", "waiting")))] == 1


def test_the_metrics_port_listens_on_127_0_0_1_unless_told_otherwise():
    from django_jobguard.management.commands.jobworker import Command
    from django_jobguard.metrics.server import MetricsServer

    parser = Command().create_parser("manage.py", "jobworker")
    assert parser.parse_args(["--metrics-port", "0"]).metrics_address == "127.0.0.1"
    assert parser.parse_args(["--metrics-address", "0.0.0.0"]).metrics_address == "0.0.0.0"
    server = MetricsServer(0)
    try:
        assert server.server.server_address[0] == "127.0.0.1"
    finally:
        server.close()
