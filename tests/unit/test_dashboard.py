"""The dashboard's data (operations.monitoring.overview), the per-minute counter upsert, the
admin page and its permissions, and GET stats/history/ (issue 14)."""

from __future__ import annotations

import datetime
import threading

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from django_jobguard import history, operations
from django_jobguard.models import PausedQueue, QueuedJob, QueueMinute, Worker
from django_jobguard.operations import monitoring
from django_jobguard.worker import RecentOutcomes
from tests.support.operate import API, delayed, failed_job, reserved, user_with, waiting

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/django_jobguard/dashboard/"


# -- the counter and its upsert ----------------------------------------------------------------


def test_counter_counts_done_and_failed_per_queue_like_the_last_minute_counts():
    assert history.DONE_STATES == RecentOutcomes.DONE
    counter = history.QueueCounter()
    for state in ("DONE", "SKIPPED", "FAILED", "RELEASED", "DELETED"):
        counter.record("mail", state)
    counter.record("pdf", "CANCELLED")
    assert counter.pending() == {"mail": (3, 1), "pdf": (1, 0)}


def test_flush_adds_to_the_minute_row_that_other_workers_wrote():
    minute = history.current_minute()
    first, second = history.QueueCounter(), history.QueueCounter()
    first.record("mail", "DONE")
    first.record("mail", "FAILED")
    second.record("mail", "DONE")
    second.record("pdf", "DONE")
    assert first.flush() == 1 and second.flush() == 2
    assert first.pending() == {} and first.flush() == 0  # nothing left, nothing written
    rows = {(r.queue, r.done, r.failed) for r in QueueMinute.objects.all()}
    assert rows == {("mail", 2, 1), ("pdf", 1, 0)}
    assert {r.minute for r in QueueMinute.objects.all()} <= {
        minute, minute + datetime.timedelta(minutes=1)}  # the minute may turn meanwhile


def test_a_failed_flush_keeps_the_counts_for_the_next_one(monkeypatch):
    counter = history.QueueCounter()
    counter.record("mail", "DONE")

    def down(*args, **kwargs):
        raise RuntimeError("database down")

    monkeypatch.setattr(history, "add_counts", down)
    with pytest.raises(RuntimeError):
        counter.flush()
    counter.record("mail", "FAILED")
    assert counter.pending() == {"mail": (1, 1)}
    monkeypatch.undo()
    counter.flush()
    assert QueueMinute.objects.get(queue="mail").done == 1


def test_add_counts_is_one_statement_and_adds_on_conflict():
    minute = timezone.now().replace(second=0, microsecond=0)
    history.add_counts({"a": (2, 1)}, minute=minute)
    with CaptureQueriesContext(connection) as captured:
        history.add_counts({"a": (3, 0), "b": (1, 4)}, minute=minute)
    assert len(captured) == 1
    assert sorted(QueueMinute.objects.values_list("queue", "done", "failed")) == [
        ("a", 5, 1), ("b", 1, 4)]


@pytest.mark.django_db(transaction=True)
def test_concurrent_upserts_lose_no_count():
    """Threads with their own connections add to one row at once (PostgreSQL: row locks of
    ON CONFLICT; SQLite: the database lock); the total is exact."""
    if connection.vendor == "sqlite" and connection.settings_dict["NAME"].startswith(
            "file:memorydb"):
        pytest.skip("an in-memory SQLite database is not shared between threads' connections")
    minute = timezone.now().replace(second=0, microsecond=0)
    errors = []

    def add():
        from django.db import connections

        try:
            for _ in range(20):
                history.add_counts({"race": (1, 1)}, minute=minute)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert QueueMinute.objects.values_list("done", "failed").get(queue="race") == (80, 80)


def test_housekeeping_prunes_minutes_older_than_two_days():
    now = timezone.now().replace(second=0, microsecond=0)
    history.add_counts({"old": (1, 0)}, minute=now - datetime.timedelta(days=3))
    history.add_counts({"new": (1, 0)}, minute=now - datetime.timedelta(days=1))
    assert operations.housekeeping().history == 1
    assert list(QueueMinute.objects.values_list("queue", flat=True)) == ["new"]


# -- the overview -------------------------------------------------------------------------------


def _live_worker(worker_id: str, queues: str, current_job: str = "") -> Worker:
    return Worker.objects.create(id=worker_id, hostname="elsewhere", pid=1, queues=queues,
                                 current_job=current_job)


def test_overview_counts_states_oldest_waiting_and_history():
    old = waiting(queue_name="mail")
    QueuedJob.objects.filter(pk=old.pk).update(
        available_at=timezone.now() - datetime.timedelta(minutes=5))
    waiting(queue_name="mail")
    high = waiting(queue_name="mail")
    QueuedJob.objects.filter(pk=high.pk).update(priority=10)
    delayed(queue_name="mail")
    reserved(queue_name="busy", worker_id="elsewhere:1:w1")
    failed_job(queue_name="mail")
    current = history.current_minute()
    history.add_counts({"mail": (30, 6)}, minute=current)
    history.add_counts({"mail": (15, 0)}, minute=current - datetime.timedelta(minutes=59))
    history.add_counts({"mail": (99, 9)}, minute=current - datetime.timedelta(minutes=60))
    history.add_counts({"mail": (7, 0)}, minute=current - datetime.timedelta(hours=25))

    data = operations.overview()
    mail = data["queues"]["mail"]
    assert (mail["waiting"], mail["delayed"], mail["reserved"], mail["failed"]) == (3, 1, 0, 1)
    assert 290 < mail["oldest_waiting_seconds"] < 400  # the 5-minute-old one, any priority
    assert mail["estimated"] is False
    assert (mail["done_last_hour"], mail["failed_last_hour"]) == (45, 6)
    assert data["queues"]["busy"]["reserved"] == 1
    hour = data["history"]["1h"]
    assert hour["step_minutes"] == 1 and len(hour["queues"]["mail"]["done"]) == 60
    assert hour["queues"]["mail"]["done"][-1] == 30 and hour["queues"]["mail"]["done"][0] == 15
    day = data["history"]["24h"]
    assert day["step_minutes"] == 60 and len(day["queues"]["mail"]["done"]) == 24
    assert day["queues"]["mail"]["total_done"] == 30 + 15 + 99  # 25 h ago is left out
    assert day["start"] == current.replace(minute=0) - datetime.timedelta(hours=23)
    this_hour = 30 + (15 if current.minute >= 59 else 0)  # 59 minutes ago: this hour too?
    assert day["queues"]["mail"]["done"][-1] == round(this_hour / (current.minute + 1), 2)


def test_counts_are_exact_up_to_the_limit_then_estimated_on_postgresql():
    QueuedJob.objects.bulk_create([QueuedJob(name="tests.support.jobs.Noop", queue="big")
                                   for _ in range(30)])
    exact = monitoring.queue_overview(exact_up_to=100)["big"]
    assert (exact["waiting"], exact["estimated"]) == (30, False)
    over = monitoring.queue_overview(exact_up_to=10)["big"]
    if connection.vendor == "postgresql":
        assert over["estimated"] is True and over["waiting"] >= 11
    else:  # no estimate elsewhere: counted exactly
        assert (over["waiting"], over["estimated"]) == (30, False)


def test_queue_counts_do_not_grow_with_the_rows():
    """One query per queue and priority, whatever the number of rows (no GROUP BY over the
    table): the same count of queries for 5 and for 50 rows."""
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            monitoring.queue_overview()
        return len(captured)

    QueuedJob.objects.bulk_create([QueuedJob(name="n", queue="q") for _ in range(5)])
    few = queries()
    QueuedJob.objects.bulk_create([QueuedJob(name="n", queue="q") for _ in range(45)])
    assert queries() == few


def test_unserved_queue_is_flagged_unless_paused_or_a_star_worker_serves_it():
    waiting(queue_name="orphan")
    waiting(queue_name="served")
    waiting(queue_name="stopped")
    PausedQueue.objects.create(queue="stopped")
    _live_worker("elsewhere:1:a", "served,other", current_job="abc")
    data = operations.overview()
    assert [q for q, c in data["queues"].items() if c["unserved"]] == ["orphan"]
    assert data["queues"]["stopped"]["paused"] is True
    [worker] = data["workers"]
    assert (worker["queues"], worker["current_job"]) == (["served", "other"], "abc")
    _live_worker("elsewhere:1:b", "*")
    assert not any(c["unserved"] for c in operations.overview()["queues"].values())


def test_monitor_flags_unserved_queues_and_exits_1(capsys):
    from django.core.management import call_command

    waiting(queue_name="orphan")
    report = operations.monitor()
    assert report.unserved == ["orphan"] and report.alerts == []
    with pytest.raises(SystemExit) as exc:
        call_command("jobs_monitor")
    assert exc.value.code == 1
    assert "UNSERVED" in capsys.readouterr().out
    call_command("jobs_monitor", "--allow-unserved")  # reported, no exit 1
    _live_worker("elsewhere:1:c", "orphan")
    call_command("jobs_monitor")


def test_store_summary_counts_held_locks_and_open_circuits(store_alias):
    from django_jobguard import get_store

    store = get_store(store_alias)
    store.acquire("jobguard:unique:dash:1", "me", ttl=60)
    store.acquire("jobguard:unique:dash:2", "me", ttl=60)
    store.release("jobguard:unique:dash:2", "me")
    for key in ("jobguard:circuit:dash-open", "jobguard:circuit:dash-closed"):
        store.circuit_enter(key, owner="w", max_attempts=1, decay=600, probe_lease=60)
    store.circuit_leave("jobguard:circuit:dash-open", owner="w", outcome="failure",
                        max_attempts=1, decay=600)  # one failure of one allowed: open
    store.circuit_leave("jobguard:circuit:dash-closed", owner="w", outcome="success",
                        max_attempts=1, decay=600)
    [summary] = [s for s in monitoring.store_summaries() if s["store"] == store_alias]
    assert summary["held_locks"] == 1 and summary["open_circuits"] == 1
    assert summary["error"] == ""
    assert store.count_locks(limit=0) == 1  # counted up to limit + 1


# -- the admin page and its permissions -----------------------------------------------------------


def test_dashboard_is_first_in_the_app_section(client):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.get("/admin/")
    [app] = [a for a in response.context["app_list"] if a["app_label"] == "django_jobguard"]
    assert app["models"][0]["object_name"] == "Dashboard"
    assert app["models"][0]["admin_url"] == DASHBOARD


def test_dashboard_page_shows_queues_charts_workers_and_store_links(client):
    waiting(queue_name="orphan")
    waiting(queue_name="mail")
    _live_worker("elsewhere:1:w", "mail", current_job="1234")
    history.add_counts({"mail": (12, 2)})
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('<svg class="jobguard-chart"') == 4  # two queues, 1 h and 24 h
    assert 'id="jobguard-unserved"' in html and "<code>orphan</code>" in html
    assert 'data-worker="elsewhere:1:w"' in html
    assert "/admin/django_jobguard/lock/?store=database" in html
    assert "/admin/django_jobguard/throttle/?store=database" in html
    assert 'action="/admin/django_jobguard/dashboard/pause/"' in html
    assert "<script" not in html.split('id="jobguard-dashboard"')[1]  # no JavaScript


def test_anonymous_is_sent_to_the_login_page(client):
    response = client.get(DASHBOARD)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    response = client.post(DASHBOARD + "pause/", {"queue": "default"})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert not PausedQueue.objects.exists()


def test_staff_without_view_permission_gets_403(client):
    client.force_login(user_with("nobody"))
    assert client.get(DASHBOARD).status_code == 403


def test_pause_buttons_need_the_change_permission_of_paused_queues(client):
    waiting(queue_name="mail")
    client.force_login(user_with("viewer", "view_queuedjob"))
    response = client.get(DASHBOARD)
    assert response.status_code == 200
    assert b"dashboard/pause/" not in response.content
    assert client.post(DASHBOARD + "pause/", {"queue": "mail"}).status_code == 403
    assert not PausedQueue.objects.exists()

    client.force_login(user_with("operator", "view_queuedjob", "change_pausedqueue"))
    response = client.post(DASHBOARD + "pause/", {"queue": "mail"}, follow=True)
    assert PausedQueue.objects.get().paused_by == "operator"
    assert b"Paused queue mail" in response.content
    assert b"dashboard/resume/" in response.content
    client.post(DASHBOARD + "resume/", {"queue": "mail"})
    assert not PausedQueue.objects.exists()
    response = client.post(DASHBOARD + "resume/", {"queue": "mail"}, follow=True)
    assert b"is not paused" in response.content  # a clear message, not a 500
    assert client.get(DASHBOARD + "pause/").status_code == 405


def test_pause_of_an_unknown_queue_is_refused_with_a_message(client):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.post(DASHBOARD + "pause/", {"queue": "nope"}, follow=True)
    assert b"Unknown queue" in response.content
    assert not PausedQueue.objects.exists()


# -- GET stats/history/ ---------------------------------------------------------------------------


def test_stats_history_api_returns_the_overview():
    waiting(queue_name="mail")
    history.add_counts({"mail": (4, 1)})
    client = APIClient()
    client.force_authenticate(user_with("reader", "view_queuedjob"))
    body = client.get(f"{API}stats/history/").json()
    mail = body["queues"]["mail"]
    assert (mail["waiting"], mail["failed_last_hour"], mail["unserved"]) == (1, 1, True)
    assert body["history"]["last_hour"]["step_minutes"] == 1
    assert len(body["history"]["last_day"]["queues"]["mail"]["done"]) == 24
    assert body["stores"][0]["store"] == "database"
    assert set(body) == {"generated_at", "queues", "workers", "done_last_minute",
                         "failed_last_minute", "stores", "history"}


def test_stats_history_api_has_the_dashboards_breaches_and_workers_needed():
    from django_jobguard.admin.dashboard import live_summary
    from django_jobguard.models import QueueAlert

    for _ in range(3):
        waiting(queue_name="mail")
    history.add_counts({"mail": (30, 0)})
    QueueAlert.objects.create(queue="mail", slo="max_wait", breached=True, value=40.0,
                              threshold=30.0, changed_at=timezone.now())
    client = APIClient()
    client.force_authenticate(user_with("reader", "view_queuedjob"))
    mail = client.get(f"{API}stats/history/").json()["queues"]["mail"]
    shown = live_summary()["queues"]["mail"]  # what the dashboard shows
    assert mail["breached"] == shown["breached"] == ["max_wait"]
    assert mail["recommended_workers"] == shown["recommended_workers"] >= 1


def test_stats_history_api_permissions():
    anonymous = APIClient().get(f"{API}stats/history/")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"]
    client = APIClient()
    client.force_authenticate(user_with("nobody"))
    assert client.get(f"{API}stats/history/").status_code == 403
    client.force_authenticate(user_with("reader", "view_queuedjob"))
    typo = client.get(f"{API}stats/history/", {"window": "1h"})
    assert typo.status_code == 400 and typo.json()["code"] == "unknown_field"


def test_a_store_that_cannot_be_read_does_not_take_the_dashboard_down(client, monkeypatch):
    from django_jobguard.stores.database import DatabaseStore

    def down(self, prefix="jobguard:", *, limit=10_000):
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(DatabaseStore, "count_locks", down)
    [summary] = [s for s in monitoring.store_summaries() if s["store"] == "database"]
    assert summary["held_locks"] is None and "store unreachable" in summary["error"]
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.get(DASHBOARD)
    assert response.status_code == 200 and b"store unreachable" in response.content
