"""The admin: every page and action, with the Django test client, on both stores."""

from __future__ import annotations

import datetime
import logging
import math
import re

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import DatabaseError
from django.utils import timezone

from django_jobguard import get_store
from django_jobguard.models import Chain, FailedJob, QueuedJob, Worker
from tests.support import operate as operate_support
from tests.support.operate import (
    UniqueReport,
    delayed,
    reserved,
    user_with,
    waiting,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def static_throttles(store_alias):
    with operate_support.static_throttles(store_alias) as rows:
        yield rows

QUEUED = "/admin/django_jobguard/queuedjob/"
FAILED = "/admin/django_jobguard/failedjob/"
LOCKS = "/admin/django_jobguard/lock/"
THROTTLES = "/admin/django_jobguard/throttle/"
CHAINS = "/admin/django_jobguard/chain/"


def action(client, url: str, name: str, ids, **extra):
    return client.post(url, {"action": name, ACTION_CHECKBOX_NAME: [str(i) for i in ids],
                             **extra}, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def failed_job(name: str = "tests.support.jobs.Boom", queue_name: str = "default",
               **extra) -> FailedJob:
    return FailedJob.objects.create(
        name=name, queue=queue_name, payload={"args": ["boom"], "kwargs": {}}, attempts=3,
        exception_class="builtins.RuntimeError", message="boom went the job",
        traceback='Traceback (most recent call last):\n  File "x.py", line 1\n'
                  "RuntimeError: boom went the job\n", **extra)


# -- index ---------------------------------------------------------------------------------


def test_index_lists_every_jobguard_page(admin_client):
    body = admin_client.get("/admin/").content.decode()
    for url in (QUEUED, FAILED, LOCKS, THROTTLES, "/admin/django_jobguard/worker/",
                "/admin/django_jobguard/jobresult/"):
        assert f'href="{url}"' in body


def test_every_model_but_the_internal_counters_has_an_admin_page(admin_client):
    """The admin package registers each area's module (admin/jobs.py, failed.py, locks.py,
    ...) when Django's autodiscover imports it: every page is there and renders."""
    from django.apps import apps
    from django.contrib import admin
    from django.urls import reverse

    # Counters and states the workers keep (the dashboard shows the alerts): no page of their own.
    internal = {"queuegate", "queueminute", "queuealert", "runstatistic"}
    models = apps.get_app_config("django_jobguard").get_models()
    paged = [model for model in models if model._meta.model_name not in internal]
    assert {model._meta.model_name for model in paged} == {
        "queuedjob", "failedjob", "lock", "throttle", "worker", "pausedqueue", "jobresult",
        "scheduletick", "chain", "batch", "dashboard", "finishedrun"}
    body = admin_client.get("/admin/").content.decode()
    for model in paged:
        assert admin.site.is_registered(model), model
        url = reverse(f"admin:django_jobguard_{model._meta.model_name}_changelist")
        assert f'href="{url}"' in body, url
        assert admin_client.get(url).status_code == 200, url
    for name in internal:
        assert not admin.site.is_registered(apps.get_model("django_jobguard", name))


def test_worker_and_result_pages_render(admin_client):
    reserved(worker_id="host:9:feed")
    body = admin_client.get("/admin/django_jobguard/worker/").content.decode()
    assert "host:9:feed" in body
    assert admin_client.get("/admin/django_jobguard/jobresult/").status_code == 200


# -- queued jobs ---------------------------------------------------------------------------


def test_queued_list_shows_state_attempts_and_worker(admin_client):
    w, d, r = waiting(), delayed(), reserved(worker_id="host:1:cafe")
    body = admin_client.get(QUEUED).content.decode()
    assert "waiting" in body
    assert "delayed until" in body
    assert re.search(r"reserved by <code>host:1:cafe</code> since \d{4}-\d\d-\d\d", body)
    for row in (w, d, r):
        assert str(row.id) in body


@pytest.mark.parametrize("state", ["waiting", "delayed", "reserved"])
def test_queued_state_filter(admin_client, state):
    rows = {"waiting": waiting(), "delayed": delayed(), "reserved": reserved()}
    response = admin_client.get(QUEUED, {"state": state})
    shown = {str(job.id) for job in response.context["cl"].result_list}
    assert shown == {str(rows[state].id)}


def test_queued_queue_and_name_filters_and_search(admin_client):
    a = waiting(name="tests.support.jobs.Noop", queue_name="emails")
    b = waiting(name="tests.support.jobs.Record", queue_name="default")

    def shown(params):
        return {job.id for job in admin_client.get(QUEUED, params).context["cl"].result_list}

    assert shown({"queue": "emails"}) == {a.id}
    assert shown({"name": "tests.support.jobs.Record"}) == {b.id}
    assert shown({"q": "Record"}) == {b.id}
    assert shown({"q": str(a.id)}) == {a.id}
    assert shown({"q": "no-such-thing"}) == set()


def test_queued_detail_is_read_only_with_pretty_payload(admin_client):
    job = waiting(name="tests.support.jobs.Noop", note={"nested": [1, 2]})
    response = admin_client.get(f"{QUEUED}{job.id}/change/")
    body = response.content.decode()
    assert response.status_code == 200
    assert '<pre class="jobguard-json">' in body
    assert "&quot;nested&quot;: [\n" in body  # indented JSON, HTML-escaped
    assert 'name="_save"' not in body
    assert 'name="queue"' not in body  # no editable inputs
    assert admin_client.post(f"{QUEUED}{job.id}/change/", {"queue": "x"}).status_code == 403
    assert admin_client.get(f"{QUEUED}add/").status_code == 403


def test_run_now_makes_delayed_jobs_due_and_leaves_reserved_alone(admin_client):
    d, r = delayed(), reserved()
    lease = r.available_at
    response = action(admin_client, QUEUED, "run_now", [d.id, r.id])
    assert "1 job is due now." in messages_of(response)
    assert "1 job is reserved by a worker and was left alone." in messages_of(response)
    d.refresh_from_db()
    r.refresh_from_db()
    assert d.available_at <= timezone.now()
    assert r.available_at == lease


def test_delete_asks_for_confirmation_then_deletes_and_frees_unique_locks(admin_client,
                                                                         store_alias):
    dispatched = UniqueReport(1).dispatch()
    key = "jobguard:unique:tests.operate.UniqueReport:1"
    assert get_store().get_lock(key) is not None
    busy = reserved()
    confirm = action(admin_client, QUEUED, "delete_selected", [dispatched.id, busy.id])
    assert "Are you sure" in confirm.content.decode()
    assert "1 selected job is reserved by a worker and will not be deleted." in \
        messages_of(confirm)
    assert QueuedJob.objects.filter(id=dispatched.id).exists()

    done = action(admin_client, QUEUED, "delete_selected", [dispatched.id, busy.id], post="yes")
    assert "Successfully deleted 1 queued job." in messages_of(done)
    assert not QueuedJob.objects.filter(id=dispatched.id).exists()
    assert QueuedJob.objects.filter(id=busy.id).exists()
    assert get_store().get_lock(key) is None
    assert UniqueReport(1).dispatch()  # the lock is free for a new copy


def test_delete_page_refuses_a_reserved_job_but_deletes_a_waiting_one(admin_client):
    busy, idle = reserved(), waiting()
    assert admin_client.get(f"{QUEUED}{busy.id}/delete/").status_code == 403
    response = admin_client.post(f"{QUEUED}{idle.id}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not QueuedJob.objects.filter(id=idle.id).exists()


def test_actions_need_change_and_delete_permissions(client):
    job = delayed()
    user_with("viewer", "view_queuedjob")
    client.login(username="viewer", password="pw")
    response = client.get(QUEUED)
    assert response.status_code == 200
    assert "run_now" not in response.content.decode()
    action(client, QUEUED, "run_now", [job.id])
    job.refresh_from_db()
    assert job.available_at > timezone.now()


# -- failed jobs ---------------------------------------------------------------------------


def test_failed_list_shows_exception_and_message_and_filters(admin_client):
    a = failed_job(queue_name="emails")
    b = failed_job(name="tests.support.jobs.FailMe")
    FailedJob.objects.filter(id=b.id).update(failed_at=timezone.now() - datetime.timedelta(
        days=400))
    body = admin_client.get(FAILED).content.decode()
    assert "RuntimeError" in body and "boom went the job" in body

    def shown(params):
        return {job.id for job in admin_client.get(FAILED, params).context["cl"].result_list}

    assert shown({"queue": "emails"}) == {a.id}
    assert shown({"name": "tests.support.jobs.FailMe"}) == {b.id}
    since = str(timezone.now() - datetime.timedelta(days=7))  # as the "Past 7 days" link
    assert shown({"failed_at__gte": since}) == {a.id}
    assert shown({"q": "FailMe"}) == {b.id}


def test_failed_detail_shows_the_traceback(admin_client):
    job = failed_job()
    body = admin_client.get(f"{FAILED}{job.id}/change/").content.decode()
    assert '<pre class="jobguard-traceback">Traceback (most recent call last):' in body
    assert 'name="_save"' not in body


def test_failed_detail_shows_the_traceback_once_and_a_styled_retry_button(admin_client):
    """Issue 30 item 8: last_error repeats the traceback of the run that failed the job."""
    from tests.support import jobs, make_due, work

    jobs.Boom("thrice").dispatch()  # three tries
    states = []
    for _ in range(3):
        states += work()
        make_due()
    assert states == ["RELEASED", "RELEASED", "FAILED"]
    job = FailedJob.objects.get()
    assert job.traceback.strip() in job.last_error  # what used to be shown twice
    body = admin_client.get(f"{FAILED}{job.id}/change/").content.decode()
    assert body.count("Traceback (most recent call last):") == 1
    assert "last error" not in body.lower()
    assert re.search(r'<form id="jobguard-retry" method="post" action="[^"]+" '
                     r'class="jobguard-tool">', body)
    assert "style=" not in body.split('id="jobguard-retry"')[1].split("</form>")[0]
    assert "django_jobguard/admin-lists.css" in body
    from tests.support import ROOT

    css = (ROOT / "django_jobguard/static/django_jobguard/admin-lists.css").read_text()
    assert ".object-tools form.jobguard-tool button {" in css


def test_failed_detail_shows_an_earlier_runs_error_beside_the_traceback(admin_client):
    job = failed_job()
    FailedJob.objects.filter(id=job.id).update(
        last_error="builtins.ValueError: the run before\n\nTraceback (most recent call last):"
                   "\nValueError: the run before\n")
    body = admin_client.get(f"{FAILED}{job.id}/change/").content.decode()
    assert body.count("Traceback (most recent call last):") == 2  # two different errors
    assert "the run before" in body


def test_retry_confirms_then_queues_again_and_removes_from_failed(admin_client):
    job = failed_job()
    confirm = action(admin_client, FAILED, "retry", [job.id])
    assert "Are you sure you want to retry 1 failed job?" in confirm.content.decode()
    assert FailedJob.objects.filter(id=job.id).exists()
    response = action(admin_client, FAILED, "retry", [job.id], post="yes")
    assert "1 job is queued again." in messages_of(response)
    assert not FailedJob.objects.filter(id=job.id).exists()
    queued = QueuedJob.objects.get(id=job.id)
    assert (queued.name, queued.attempts, queued.payload["args"]) == ("tests.support.jobs.Boom", 0,
                                                                      ["boom"])


def test_forget_confirms_then_deletes(admin_client):
    job = failed_job()
    changelist = admin_client.get(FAILED).content.decode()
    assert "Forget selected failed jobs" in changelist
    confirm = action(admin_client, FAILED, "delete_selected", [job.id])
    assert "Are you sure" in confirm.content.decode()
    assert FailedJob.objects.filter(id=job.id).exists()
    action(admin_client, FAILED, "delete_selected", [job.id], post="yes")
    assert not FailedJob.objects.filter(id=job.id).exists()


# -- locks ---------------------------------------------------------------------------------


def lock_rows(response) -> dict[str, dict]:
    return {row["key"]: row for row in response.context["rows"]}


def test_locks_page_lists_store_locks_with_stale_flags(admin_client, store_alias):
    store = get_store()
    unique_ok = UniqueReport(5).dispatch()  # its job waits: fine
    store.acquire("jobguard:unique:gone:1", "o1", job_id="00000000-0000-0000-0000-000000000001")
    running = reserved(worker_id="host:1:live")
    store.acquire("jobguard:overlap:ok:1", "o2", ttl=300, job_id=str(running.id))
    orphan = reserved(worker_id="host:2:dead")  # its worker stopped beating long ago
    Worker.objects.filter(id="host:2:dead").update(last_seen_at="2000-01-01T00:00:00Z")
    store.acquire("jobguard:overlap:dead:1", "o3", job_id=str(orphan.id))
    # No worker row, but a fresh lease: its worker may be running it (issue 27 item 3).
    rowless = reserved(worker_id="host:3:norow", queue_name="busy3", live=False)
    store.acquire("jobguard:overlap:norow:1", "o6", ttl=300, job_id=str(rowless.id))
    store.acquire("jobguard:overlap:plain", "o4")
    idle = waiting()
    store.acquire("jobguard:overlap:idle:1", "o5", job_id=str(idle.id))

    response = admin_client.get(LOCKS)
    assert response.status_code == 200
    rows = lock_rows(response)
    assert response.context["store"] == store_alias
    unique_key = "jobguard:unique:tests.operate.UniqueReport:5"
    assert rows[unique_key]["kind"] == "unique" and not rows[unique_key]["stale"]
    assert rows[unique_key]["job_id"] == unique_ok.id
    assert rows["jobguard:unique:gone:1"]["stale"]
    assert "no longer queued" in rows["jobguard:unique:gone:1"]["stale_reason"]
    assert rows["jobguard:overlap:ok:1"]["kind"] == "overlap"
    assert not rows["jobguard:overlap:ok:1"]["stale"]
    assert re.fullmatch(r"[45] min \d+ s", rows["jobguard:overlap:ok:1"]["expires"])
    assert rows["jobguard:overlap:dead:1"]["stale_reason"] == "worker host:2:dead is gone"
    assert not rows["jobguard:overlap:norow:1"]["stale"]
    assert rows["jobguard:overlap:idle:1"]["stale_reason"] == "its job is not running"
    assert rows["jobguard:overlap:plain"]["expires"] == "never"
    assert not rows["jobguard:overlap:plain"]["stale"]
    body = response.content.decode()
    assert "Force release" in body and "jobguard:overlap:ok:1" in body
    assert str(store.get_lock("jobguard:overlap:ok:1").token) in body


def test_locks_page_is_a_keyed_page_with_filters(admin_client, store_alias, monkeypatch):
    from django_jobguard.admin import LockAdmin

    monkeypatch.setattr(LockAdmin, "per_page", 20)
    store = get_store()
    for i in range(50):
        store.acquire(f"jobguard:{'unique' if i % 2 else 'overlap'}:tests.P:{i:02d}", "o")
    seen, url = set(), LOCKS
    for _ in range(10):
        response = admin_client.get(url)
        assert response.status_code == 200
        rows = lock_rows(response)
        # Redis: SCAN may give a few more; and the page after one that filled up may be the
        # end of the scan with only fencing counters left (no lock), so empty and last.
        assert len(rows) <= 20 + 100
        assert rows or (store_alias == "redis" and not response.context["next_url"])
        seen |= set(rows)
        if not response.context["next_url"]:
            break
        url = LOCKS + response.context["next_url"]
        assert "Next page" in response.content.decode()
    assert len(seen) == 50
    rows = lock_rows(admin_client.get(LOCKS, {"kind": "unique", "q": "tests.P:1"}))
    assert sorted(rows) == [f"jobguard:unique:tests.P:{i}" for i in (11, 13, 15, 17, 19)]
    # A key typed in full is looked up directly; the keys starting with it are a link.
    response = admin_client.get(LOCKS, {"q": "jobguard:overlap:tests.P:0"})
    assert sorted(lock_rows(response)) == [  # not a key: the page of keys starting with it
        f"jobguard:overlap:tests.P:0{i}" for i in (0, 2, 4, 6, 8)]
    response = admin_client.get(LOCKS, {"q": "jobguard:overlap:tests.P:04"})
    assert list(lock_rows(response)) == ["jobguard:overlap:tests.P:04"]
    assert "Other keys starting with this" in response.content.decode()
    rows = lock_rows(admin_client.get(LOCKS + response.context["more_url"]))
    assert list(rows) == ["jobguard:overlap:tests.P:04"]  # the only one
    body = admin_client.get(LOCKS, {"kind": "nope"}).content.decode()
    assert "Unknown lock kind" in body


def test_expired_database_lock_is_listed_as_stale(admin_client):
    store = get_store("database")
    store.acquire("jobguard:overlap:old", "o", ttl=60)
    from django_jobguard.models import Lock

    Lock.objects.filter(key="jobguard:overlap:old").update(
        expires_at=timezone.now() - datetime.timedelta(seconds=30))
    row = lock_rows(admin_client.get(LOCKS, {"store": "database"}))["jobguard:overlap:old"]
    assert row["stale"] and row["stale_reason"] == "expired"
    assert row["expires"].startswith("expired ")


def test_force_release_frees_the_lock(admin_client, store_alias):
    store = get_store()
    store.acquire("jobguard:overlap:demo.jobs.Charge:7", "someone")
    response = admin_client.post(f"{LOCKS}release/", {
        "store": store_alias, "key": "jobguard:overlap:demo.jobs.Charge:7"}, follow=True)
    assert "Released lock jobguard:overlap:demo.jobs.Charge:7." in messages_of(response)
    assert store.get_lock("jobguard:overlap:demo.jobs.Charge:7") is None
    assert response.redirect_chain[-1][0] == f"{LOCKS}?store={store_alias}"
    again = admin_client.post(f"{LOCKS}release/", {
        "store": store_alias, "key": "jobguard:overlap:demo.jobs.Charge:7"}, follow=True)
    assert "was not held" in messages_of(again)[0]


def test_force_release_needs_change_permission(client, store_alias):
    store = get_store()
    store.acquire("jobguard:overlap:x", "someone")
    user_with("viewer", "view_lock")
    client.login(username="viewer", password="pw")
    page = client.get(LOCKS)
    assert page.status_code == 200 and "jobguard:overlap:x" in page.content.decode()
    assert "Force release" not in page.content.decode()
    assert client.post(f"{LOCKS}release/", {"store": store_alias,
                                            "key": "jobguard:overlap:x"}).status_code == 403
    assert store.get_lock("jobguard:overlap:x") is not None
    assert client.get(f"{LOCKS}release/").status_code == 405


@pytest.mark.parametrize("kind", ["database", "redis"])
@pytest.mark.parametrize("page, done", [(LOCKS, "release"), (THROTTLES, "reset")])
def test_an_action_on_a_store_that_cannot_be_reached_shows_an_error(admin_client, caplog,
                                                                    kind, page, done):
    """Force release (its confirmation asks the store too) and reset: an error message
    naming the store and the error, back on the list; before, a 500. (The messages are read
    from the request: the database store's failed DELETE left the test's transaction
    unusable for the list's page, as a real outage would leave any transaction.)"""
    from django.contrib.messages import ERROR, get_messages

    from tests.support.store_faults import store_down

    with store_down(kind) as alias:
        response = admin_client.post(f"{page}{done}/", {
            "store": alias, "key": "jobguard:overlap:demo.jobs.Charge:7"})
    assert response.status_code == 302 and response["Location"] == f"{page}?store={alias}"
    shown = [(m.level, str(m)) for m in get_messages(response.wsgi_request)]
    assert len(shown) == 1 and shown[0][0] == ERROR
    assert shown[0][1].startswith(f"Could not reach the store {alias}: ")
    assert any(r.name == "django_jobguard.admin" and r.levelno == logging.WARNING
               and f"Could not {done} jobguard:overlap:demo.jobs.Charge:7: store {alias} is "
               f"unavailable" in r.getMessage() and not r.exc_info for r in caplog.records)


@pytest.mark.parametrize("kind", ["database", "redis"])
@pytest.mark.parametrize("page", [LOCKS, THROTTLES])
def test_a_list_of_a_store_that_cannot_be_reached_logs_one_line(admin_client, caplog, kind,
                                                                page):
    """The lock and throttle lists of a store that is down show the error, and log it once as
    a WARNING line without a traceback (an outage is expected, not a bug of the page); before,
    ``logger.exception``: an ERROR with the traceback, on every load of the page."""
    from tests.support.store_faults import store_down

    with store_down(kind) as alias, caplog.at_level(logging.INFO):
        response = admin_client.get(f"{page}?store={alias}")
    assert response.status_code == 200
    assert response.context["error"].startswith(f"Could not read the store {alias}: ")
    assert "unavailable" not in response.context["error"]  # the backend's line, not ours
    assert response.context["error"] in response.content.decode()
    lines = [(r.name, r.levelno, r.getMessage(), r.exc_info) for r in caplog.records
             if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    name, level, message, exc_info = lines[0]
    assert (name, level, exc_info) == ("django_jobguard.admin", logging.WARNING, None)
    assert message.startswith(f"Could not list store {alias}: it is unavailable (")
    assert "\n" not in message


def test_lock_pages_need_staff_and_model_permission(client):
    user_with("plain", staff=True)
    client.login(username="plain", password="pw")
    assert client.get(LOCKS).status_code == 403
    assert client.get(THROTTLES).status_code == 403
    client.logout()
    user_with("outsider", "view_lock", staff=False)
    client.login(username="outsider", password="pw")
    response = client.get(LOCKS)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_unknown_store_shows_an_error_not_a_crash(admin_client):
    response = admin_client.get(LOCKS, {"store": "nope"})
    assert response.status_code == 200
    assert "Unknown store &#x27;nope&#x27;" in response.content.decode()


def test_store_selector_lists_usable_stores(admin_client, store_alias):
    from django_jobguard.operations import usable_stores

    response = admin_client.get(LOCKS, {"store": store_alias})
    assert response.context["stores"] == usable_stores()
    assert response.context["stores"][0] == store_alias  # the default store first
    if len(usable_stores()) > 1:
        assert 'name="store"' in response.content.decode()


# -- throttles -----------------------------------------------------------------------------


def test_throttles_page_shows_windows_and_circuits(admin_client, static_throttles):
    response = admin_client.get(THROTTLES)
    assert [r["key"] for r in response.context["windows"]] == ["jobguard:rate:api:user:7"]
    [circuit] = response.context["circuits"]
    assert (circuit["state"], circuit["hits"], circuit["limit"]) == ("open", 10, 10)
    body = response.content.decode()
    assert "3 / 5" in body and re.search(r"\b[34]\d s\b", body)
    assert "Reset" in body


def test_reset_throttle(admin_client, static_throttles, store_alias):
    response = admin_client.post(f"{THROTTLES}reset/", {
        "store": store_alias, "key": "jobguard:circuit:demo.jobs.SyncProfile"}, follow=True)
    assert "Reset jobguard:circuit:demo.jobs.SyncProfile." in messages_of(response)
    assert [r.key for r in get_store().throttles()] == ["jobguard:rate:api:user:7"]


def test_reset_needs_change_permission(client, static_throttles, store_alias):
    user_with("viewer", "view_throttle")
    client.login(username="viewer", password="pw")
    assert client.get(THROTTLES).status_code == 200
    assert client.post(f"{THROTTLES}reset/", {"store": store_alias,
                                              "key": "jobguard:rate:api:user:7"}).status_code == 403
    assert len(get_store().throttles()) == 2


def test_store_without_throttle_listing_shows_a_message(admin_client, monkeypatch):
    from django_jobguard.stores.base import Store
    from django_jobguard.stores.database import DatabaseStore

    monkeypatch.setattr(DatabaseStore, "throttles", Store.throttles)
    monkeypatch.setattr(DatabaseStore, "reset_throttle", Store.reset_throttle)
    response = admin_client.get(THROTTLES, {"store": "database"})
    assert response.status_code == 200
    assert "cannot list these entries yet" in response.content.decode()
    reset = admin_client.post(f"{THROTTLES}reset/", {"store": "database", "key": "k"},
                              follow=True)
    assert "cannot do this yet" in messages_of(reset)[0]


def test_batch_pages_show_progress_and_cancel_needs_change_permission(admin_client, client):
    from django.contrib.auth.models import Permission, User

    from django_jobguard import batch
    from django_jobguard.models import Batch
    from tests.support.flow_jobs import Step

    row = batch([Step("a"), Step("b")], name="import").dispatch()
    body = admin_client.get("/admin/django_jobguard/batch/").content.decode()
    assert "import" in body and 'class="jobguard-batch-bar jobguard-batch-running"' in body
    assert 'style="width: 0.0%"' in body and "0 / 2" in body
    detail = admin_client.get(f"/admin/django_jobguard/batch/{row.id}/change/")
    assert detail.status_code == 200 and "running" in detail.content.decode()
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_batch"))
    client.force_login(viewer)
    client.post("/admin/django_jobguard/batch/", {"action": "cancel_batches",
                                                   "_selected_action": [str(row.id)]})
    assert not Batch.objects.get(id=row.id).cancelled  # no change permission: no action
    response = admin_client.post("/admin/django_jobguard/batch/", {
        "action": "cancel_batches", "_selected_action": [str(row.id)]}, follow=True)
    assert "Cancelled 1 batch." in response.content.decode()
    assert Batch.objects.get(id=row.id).cancelled


def test_a_failed_batch_bar_shows_its_failed_share_in_red(admin_client):
    """A batch that ran every job but failed some is not drawn as a full green bar."""
    from django.utils import timezone

    from django_jobguard.models import Batch

    Batch.objects.create(name="half", total_jobs=4, pending_jobs=2, failed_jobs=2,
                         finished_at=timezone.now())
    Batch.objects.create(name="whole", total_jobs=4, pending_jobs=0, failed_jobs=0,
                         finished_at=timezone.now())
    body = admin_client.get("/admin/django_jobguard/batch/").content.decode()
    assert ('class="jobguard-batch-bar jobguard-batch-failed" role="img" '
            'aria-label="4 / 4, 2 failed (failed)"') in body
    assert ('<span class="ok" style="width: 50.0%"></span>'
            '<span class="failed" style="width: 50.0%"></span>') in body
    assert ('<span class="ok" style="width: 100.0%"></span>'
            '<span class="failed" style="width: 0.0%"></span>') in body


# -- bad stored data: the pages say so, never a 500 ------------------------------------------


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_stored_progress_that_is_not_0_to_1_shows_unreadable(admin_client, value):
    job = reserved()
    try:
        QueuedJob.objects.filter(id=job.id).update(progress=value)
    except DatabaseError:
        pytest.skip(f"this database cannot store {value!r} in a float column")
    job.refresh_from_db()
    if job.progress is None:
        pytest.skip(f"this database stores {value!r} as NULL")
    listed = admin_client.get(QUEUED)
    assert listed.status_code == 200 and f"unreadable ({value!r})" in listed.content.decode()
    detail = admin_client.get(f"{QUEUED}{job.id}/change/")
    assert detail.status_code == 200 and f"unreadable ({value!r})" in detail.content.decode()


@pytest.mark.parametrize("links", [{"0": {"status": "done"}}, "abc", 7, ["x", 1]])
def test_a_chain_whose_links_are_not_a_list_of_objects_shows_unreadable(admin_client, links):
    row = Chain.objects.create(name="broken", links=links)
    listed = admin_client.get(CHAINS)
    assert listed.status_code == 200 and "unreadable links" in listed.content.decode()
    detail = admin_client.get(f"{CHAINS}{row.id}/change/")
    assert detail.status_code == 200
    assert "unreadable links (not a list of objects)" in detail.content.decode()


def test_throttles_whose_stored_state_cannot_be_decoded_show_unreadable(admin_client,
                                                                        store_alias):
    operate_support.corrupt_throttles(store_alias)
    response = admin_client.get(THROTTLES, {"store": store_alias})
    assert response.status_code == 200
    assert [r["key"] for r in response.context["windows"]] == ["jobguard:rate:corrupt"]
    assert [r["state"] for r in response.context["circuits"]] == ["unreadable"]
    assert response.content.decode().count("unreadable state (bad stored data; reset it)") == 2
