"""The REST API: every endpoint, its permissions, bad input and the OpenAPI schema."""

from __future__ import annotations

import datetime
import io
import math
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from django_jobguard import get_store
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.worker import Worker, WorkerOptions
from tests.support import operate as operate_support
from tests.support.operate import (
    API,
    DISPATCHABLE,
    ENDPOINTS,
    UniqueReport,
    assert_error,
    delayed,
    failed_job,
    reserved,
    user_with,
    waiting,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def static_throttles(store_alias):
    with operate_support.static_throttles(store_alias) as rows:
        yield rows



@pytest.fixture
def api(admin_user) -> APIClient:
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


@pytest.fixture(autouse=True)
def _dispatchable():
    with override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                     "API_DISPATCHABLE_JOBS": DISPATCHABLE}):
        yield


# -- who may call ----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_anonymous_is_refused_everywhere(method, path):
    # DRF's default authentication is Session then Basic: Basic can challenge, so 401.
    response = getattr(APIClient(), method)(API + path)
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == 'Basic realm="api"'


def test_anonymous_gets_403_when_no_authentication_class_can_challenge(monkeypatch):
    from rest_framework.authentication import SessionAuthentication
    from rest_framework.views import APIView

    # What DEFAULT_AUTHENTICATION_CLASSES = [SessionAuthentication] gives every view.
    monkeypatch.setattr(APIView, "authentication_classes", [SessionAuthentication])
    response = APIClient().get(API + "jobs/")
    assert_error(response, 403, "not_authenticated")
    assert "WWW-Authenticate" not in response


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_non_staff_is_refused_everywhere(method, path):
    client = APIClient()
    client.force_authenticate(user_with("someone", staff=False))
    response = getattr(client, method)(API + path)
    assert_error(response, 403, "permission_denied")


def test_wrong_basic_credentials_are_refused():
    response = APIClient().get(API + "jobs/", HTTP_AUTHORIZATION="Basic bm9ib2R5Om5vcGU=")
    assert_error(response, 401, "authentication_failed")
    assert response["WWW-Authenticate"] == 'Basic realm="api"'


def test_permission_classes_come_from_settings():
    settings = {**jobguard_settings.user_settings,
                "API_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"]}
    with override_settings(JOBGUARD=settings):
        assert APIClient().get(API + "stats/").status_code == 200
    settings["API_PERMISSION_CLASSES"] = ["no.such.Permission"]
    with override_settings(JOBGUARD=settings), pytest.raises(ImproperlyConfigured,
                                                            match="no.such.Permission"):
        APIClient().get(API + "stats/")


def test_model_permissions_class_checks_each_method(store_alias):
    settings = {**jobguard_settings.user_settings, "API_PERMISSION_CLASSES": [
        "django_jobguard.api.permissions.JobGuardModelPermissions"]}
    get_store().acquire("jobguard:overlap:k", "o")
    client = APIClient()
    client.force_authenticate(user_with("ops", "view_lock", staff=False))
    with override_settings(JOBGUARD=settings):
        assert client.get(API + "locks/").status_code == 200
        assert client.delete(API + "locks/jobguard:overlap:k/").status_code == 403
        assert client.get(API + "jobs/").status_code == 403
        assert client.get(API + "schema/").status_code == 403
        client.force_authenticate(user_with("ops2", "view_lock", "change_lock", staff=False))
        assert client.delete(API + "locks/jobguard:overlap:k/").status_code == 204


# -- jobs ----------------------------------------------------------------------------------


def test_jobs_list_with_state_and_filters(api):
    w, d = waiting(queue_name="emails"), delayed(name="tests.support.jobs.Record")
    r = reserved(worker_id="host:1:aa")
    body = api.get(API + "jobs/").json()
    assert body["count"] == 3
    states = {item["id"]: item["state"] for item in body["results"]}
    assert states == {str(w.id): "waiting", str(d.id): "delayed", str(r.id): "reserved"}
    reserved_item = next(i for i in body["results"] if i["id"] == str(r.id))
    assert reserved_item["reserved_by"] == "host:1:aa" and reserved_item["attempts"] == 1

    def ids(**params):
        return [item["id"] for item in api.get(API + "jobs/", params).json()["results"]]

    assert ids(queue="emails") == [str(w.id)]
    assert ids(name="tests.support.jobs.Record") == [str(d.id)]
    assert ids(state="reserved") == [str(r.id)]
    assert ids(state="delayed", queue="emails") == []


def test_jobs_list_rejects_bad_filters(api):
    body = assert_error(api.get(API + "jobs/", {"state": "sleeping"}), 400, "invalid")
    assert "state" in body["errors"]
    body = assert_error(api.get(API + "jobs/", {"queue": "a\x00b"}), 400, "invalid")
    assert "queue" in body["errors"]


def test_jobs_are_paginated(api):
    for _ in range(3):
        waiting()
    body = api.get(API + "jobs/", {"page_size": 2}).json()
    assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]
    assert len(api.get(body["next"]).json()["results"]) == 1
    assert_error(api.get(API + "jobs/", {"page": 9}), 404, "not_found")


def test_job_retrieve_and_unknown_ids(api):
    job = waiting(note="hi")
    body = api.get(f"{API}jobs/{job.id}/").json()
    assert body["payload"]["note"] == "hi" and body["state"] == "waiting"
    assert_error(api.get(f"{API}jobs/{uuid.uuid4()}/"), 404, "not_found")
    assert_error(api.get(f"{API}jobs/not-a-uuid/"), 404, "not_found")


def store_bad_progress(value: float) -> QueuedJob:
    """A reserved job whose stored progress is ``value`` (written around the write path's
    check, as a bad migration or a hand edit would)."""
    job = reserved()
    try:
        QueuedJob.objects.filter(id=job.id).update(progress=value, progress_message="half")
    except DatabaseError:
        pytest.skip(f"this database cannot store {value!r} in a float column")
    job.refresh_from_db()
    if job.progress is None:
        pytest.skip(f"this database stores {value!r} as NULL")
    return job


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 7.5])
def test_a_stored_progress_that_is_not_0_to_1_reads_as_null(api, value):
    job = store_bad_progress(value)
    listed = api.get(API + "jobs/")
    assert listed.status_code == 200
    assert [(r["id"], r["progress"]) for r in listed.json()["results"]] == [(str(job.id), None)]
    detail = api.get(f"{API}jobs/{job.id}/")
    assert detail.status_code == 200
    assert detail.json()["progress"] is None and detail.json()["progress_message"] == "half"


def test_delete_cancels_a_waiting_job_and_frees_its_unique_lock(api, store_alias):
    dispatched = UniqueReport(3).dispatch()
    assert api.delete(f"{API}jobs/{dispatched.id}/").status_code == 204
    assert not QueuedJob.objects.filter(id=dispatched.id).exists()
    assert get_store().get_lock("jobguard:unique:tests.operate.UniqueReport:3") is None
    assert_error(api.delete(f"{API}jobs/{dispatched.id}/"), 404)


def test_delete_refuses_a_reserved_job(api):
    job = reserved()
    body = assert_error(api.delete(f"{API}jobs/{job.id}/"), 409, "reserved")
    assert "reserved by worker host:1:abc" in body["detail"]
    assert QueuedJob.objects.filter(id=job.id).exists()


# -- failed jobs ---------------------------------------------------------------------------


def test_failed_jobs_list_filter_and_retrieve(api):
    a, b = failed_job(queue_name="emails"), failed_job(name="tests.support.jobs.FailMe")
    listed = api.get(API + "failed-jobs/").json()
    assert listed["count"] == 2 and "traceback" not in listed["results"][0]
    assert [i["id"] for i in api.get(API + "failed-jobs/", {"queue": "emails"}).json()[
        "results"]] == [str(a.id)]
    assert [i["id"] for i in api.get(API + "failed-jobs/", {"name": "tests.support.jobs.FailMe"})
            .json()["results"]] == [str(b.id)]
    detail = api.get(f"{API}failed-jobs/{a.id}/").json()
    assert detail["traceback"].startswith("Traceback") and detail["exception_class"] == \
        "builtins.RuntimeError"
    assert_error(api.get(f"{API}failed-jobs/{uuid.uuid4()}/"), 404, "not_found")


def test_retry_one(api):
    job = failed_job()
    assert api.post(f"{API}failed-jobs/{job.id}/retry/").json() == {"retried": 1,
                                                                    "ids": [str(job.id)]}
    assert QueuedJob.objects.get(id=job.id).attempts == 0
    assert not FailedJob.objects.exists()
    assert_error(api.post(f"{API}failed-jobs/{job.id}/retry/"), 404)


@pytest.mark.parametrize("fmt", ["multipart", "urlencoded"])
def test_an_action_without_a_body_accepts_an_empty_form(api, fmt):
    # Django's test client and many HTTP clients send an empty multipart form with a POST.
    job = failed_job()
    if fmt == "multipart":
        response = api.post(f"{API}failed-jobs/{job.id}/retry/", {}, format="multipart")
    else:
        response = api.post(f"{API}failed-jobs/{job.id}/retry/", "",
                            content_type="application/x-www-form-urlencoded")
    assert response.status_code == 200, response.content
    assert response.json() == {"retried": 1, "ids": [str(job.id)]}
    assert QueuedJob.objects.filter(id=job.id).exists()


def test_an_action_without_a_body_refuses_a_form_with_fields(api):
    job = failed_job()
    for data in ({"queue": "emails"}, {"f": io.BytesIO(b"x")}):
        response = api.post(f"{API}failed-jobs/{job.id}/retry/", data, format="multipart")
        assert_error(response, 415, "unsupported_media_type")
    assert FailedJob.objects.filter(id=job.id).exists()


def test_retry_conflicts_with_a_queued_job_of_the_same_id(api):
    job = failed_job()
    QueuedJob.objects.create(id=job.id, name=job.name, queue="default")
    assert_error(api.post(f"{API}failed-jobs/{job.id}/retry/"), 409, "duplicate")
    assert FailedJob.objects.filter(id=job.id).exists()


def test_retry_all_optionally_by_queue(api):
    a, b, c = failed_job(queue_name="emails"), failed_job(), failed_job()
    body = api.post(API + "failed-jobs/retry-all/", {"queue": "emails"}, format="json").json()
    assert body == {"retried": 1, "ids": [str(a.id)]}
    body = api.post(API + "failed-jobs/retry-all/").json()
    assert body["retried"] == 2 and set(body["ids"]) == {str(b.id), str(c.id)}
    assert QueuedJob.objects.count() == 3 and not FailedJob.objects.exists()
    bad = api.post(API + "failed-jobs/retry-all/", {"queue": ["x"]}, format="json")
    assert "queue" in assert_error(bad, 400, "invalid")["errors"]


def test_forget(api):
    job = failed_job()
    assert api.delete(f"{API}failed-jobs/{job.id}/").status_code == 204
    assert not FailedJob.objects.exists()
    assert_error(api.delete(f"{API}failed-jobs/{job.id}/"), 404)


# -- locks ---------------------------------------------------------------------------------


def test_locks_list_and_detail(api, store_alias):
    store = get_store()
    token = store.acquire("jobguard:overlap:demo.jobs.Charge:7", "w1", ttl=120)
    store.acquire("jobguard:unique:gone:1", "o", job_id=str(uuid.uuid4()))
    body = api.get(API + "locks/").json()
    rows = {r["key"]: r for r in body["results"]}
    charge = rows["jobguard:overlap:demo.jobs.Charge:7"]
    assert (charge["kind"], charge["owner"], charge["token"], charge["store"]) == (
        "overlap", "w1", token, store_alias)
    assert 100 < charge["expires_in"] <= 120 and not charge["stale"]
    assert rows["jobguard:unique:gone:1"]["stale"]
    one = api.get(API + "locks/jobguard:overlap:demo.jobs.Charge:7/").json()
    assert one["token"] == token
    assert_error(api.get(API + "locks/jobguard:none/"), 404, "not_found")


def test_locks_list_is_a_keyed_page_narrowed_by_kind_and_prefix(api, store_alias):
    store = get_store()
    for i in range(120):
        store.acquire(f"jobguard:{'unique' if i % 2 else 'overlap'}:tests.P:{i:03d}", "o")
    keys, url, pages = [], API + "locks/?page_size=50", 0
    while url:
        body = api.get(url).json()
        assert set(body) == {"next", "results"}
        keys += [row["key"] for row in body["results"]]
        url, pages = body["next"], pages + 1
    assert len(set(keys)) == 120 and pages >= 2
    unique = api.get(API + "locks/", {"kind": "unique", "prefix": "tests.P:00"}).json()
    assert sorted(r["key"] for r in unique["results"]) == [
        f"jobguard:unique:tests.P:00{i}" for i in (1, 3, 5, 7, 9)]
    assert_error(api.get(API + "locks/", {"kind": "rate"}), 400, "invalid")
    assert_error(api.get(API + "locks/", {"page_size": 0}), 400, "invalid")
    if store_alias == "redis":
        body = assert_error(api.get(API + "locks/", {"cursor": "abc"}), 400, "invalid")
        assert "not a cursor" in body["errors"]["cursor"][0]


def test_lock_detail_looks_the_key_up_without_listing(api, monkeypatch):
    store = get_store()
    store.acquire("jobguard:overlap:one", "o")
    monkeypatch.setattr(type(store), "locks", lambda *a, **k: pytest.fail("listed all"))
    monkeypatch.setattr(type(store), "lock_page", lambda *a, **k: pytest.fail("paged"))
    assert api.get(API + "locks/jobguard:overlap:one/").json()["owner"] == "o"


def test_delete_lock_force_releases_keys_with_colons_and_dots(api, store_alias):
    store = get_store()
    key = "jobguard:unique:demo.jobs.SyncProfile:a/b c"
    store.acquire(key, "someone")
    assert api.delete(f"{API}locks/{key.replace(' ', '%20')}/?store={store_alias}"
                      ).status_code == 204
    assert store.get_lock(key) is None
    assert_error(api.delete(f"{API}locks/{key.replace(' ', '%20')}/"), 404, "not_found")


def test_lock_bad_key_and_unknown_store(api):
    body = assert_error(api.delete(API + "locks/jobguard:%01/"), 400, "invalid")
    assert "key" in body["errors"]
    body = assert_error(api.get(API + "locks/", {"store": "nope"}), 400, "invalid")
    assert "Unknown store 'nope'" in body["errors"]["store"][0]
    assert_error(api.delete(API + "locks/" + "k" * 300 + "/"), 400, "invalid")


# -- throttles -----------------------------------------------------------------------------


def test_throttles_list_detail_and_reset(api, static_throttles, store_alias):
    body = api.get(API + "throttles/").json()
    rows = {r["key"]: r for r in body["results"]}
    circuit = rows["jobguard:circuit:demo.jobs.SyncProfile"]
    assert (circuit["kind"], circuit["state"], circuit["hits"], circuit["limit"]) == (
        "circuit", "open", 10, 10)
    window = rows["jobguard:rate:api:user:7"]
    assert (window["hits"], window["limit"], window["store"]) == (3, 5, store_alias)
    # 40 s from the test's clock; the store counts from its own (the database's, to the
    # millisecond on SQLite), which may stand a few microseconds behind it.
    assert 30 < window["resets_in"] <= 40.01
    assert api.get(API + "throttles/jobguard:rate:api:user:7/").json()["hits"] == 3
    assert api.delete(API + "throttles/jobguard:rate:api:user:7/").status_code == 204
    assert [r.key for r in get_store().throttles()] == ["jobguard:circuit:demo.jobs.SyncProfile"]
    assert_error(api.delete(API + "throttles/jobguard:rate:api:user:7/"), 404, "not_found")
    assert_error(api.get(API + "throttles/jobguard:rate:api:user:7/"), 404, "not_found")


def test_throttles_whose_stored_state_cannot_be_decoded_are_listed_unreadable(api,
                                                                              store_alias):
    keys = operate_support.corrupt_throttles(store_alias)
    response = api.get(API + "throttles/")
    assert response.status_code == 200
    rows = {r["key"]: r for r in response.json()["results"]}
    assert {key: (rows[key]["kind"], rows[key]["state"], rows[key]["hits"], rows[key]["limit"])
            for key in keys} == {"jobguard:rate:corrupt": ("rate", "unreadable", 0, 5),
                                 "jobguard:circuit:corrupt": ("circuit", "unreadable", 0, 3)}
    assert api.get(f"{API}throttles/{keys[0]}/").json()["state"] == "unreadable"
    assert api.delete(f"{API}throttles/{keys[0]}/").status_code == 204  # and it can be reset
    assert [r.key for r in get_store().throttles()] == [keys[1]]


def test_throttles_on_a_store_that_cannot_list_them(api, monkeypatch):
    from django_jobguard.stores.base import Store
    from django_jobguard.stores.database import DatabaseStore

    monkeypatch.setattr(DatabaseStore, "throttles", Store.throttles)
    monkeypatch.setattr(DatabaseStore, "reset_throttle", Store.reset_throttle)
    assert_error(api.get(API + "throttles/", {"store": "database"}), 501, "not_supported")
    # DELETE carries its data in the body; the store is chosen by the query string.
    assert_error(api.delete(API + "throttles/k/?store=database"), 501, "not_supported")


# -- stats ---------------------------------------------------------------------------------


def test_stats_counts_per_queue_and_jobs_done_in_the_last_minute(api):
    waiting(queue_name="emails")
    delayed(queue_name="emails")
    reserved(queue_name="busy")
    failed_job(queue_name="emails")
    worker = Worker(WorkerOptions(queues=["default"]))
    WorkerRow.objects.create(id=worker.id, hostname="h", pid=1, queues="default")
    for n in range(3):
        waiting(name="tests.support.jobs.Noop", n=n)
    waiting(name="tests.support.jobs.FailMe")
    from django_jobguard import queue

    for row in queue.claim(["default"], worker_id=worker.id, limit=10):
        worker.process_claimed(row)
    worker.heartbeat()
    body = api.get(API + "stats/").json()
    assert body["queues"]["emails"] == {"waiting": 1, "delayed": 1, "reserved": 0, "failed": 1}
    assert body["queues"]["busy"]["reserved"] == 1
    assert body["queues"]["default"]["failed"] == 1
    assert (body["done_last_minute"], body["failed_last_minute"]) == (3, 1)
    assert body["workers"] == 2  # this one and the live worker holding the reserved job
    WorkerRow.objects.filter(id=worker.id).update(
        last_seen_at=timezone.now() - datetime.timedelta(hours=1))
    assert api.get(API + "stats/").json()["done_last_minute"] == 0


# -- dispatch ------------------------------------------------------------------------------


def post(api, **body):
    return api.post(API + "dispatch/", body, format="json")


def test_dispatch_queues_the_job(api):
    response = post(api, job="demo.jobs.SyncProfile", args=[7])
    assert response.status_code == 201
    body = response.json()
    row = QueuedJob.objects.get(id=body["id"])
    assert (row.name, row.queue, row.payload["args"]) == ("demo.jobs.SyncProfile", "default",
                                                          [7])
    assert body == {"id": str(row.id), "job": "demo.jobs.SyncProfile", "queue": "default"}


def test_dispatch_function_job_with_queue_delay_and_priority(api):
    response = post(api, job="demo.jobs.send_welcome_email", kwargs={"user_email": "a@b.c"},
                    queue="mail2", delay=600, priority=5)
    assert response.status_code == 201, response.content
    row = QueuedJob.objects.get(id=response.json()["id"])
    assert (row.queue, row.priority, row.payload["kwargs"]) == ("mail2", 5,
                                                                {"user_email": "a@b.c"})
    assert row.available_at > timezone.now() + datetime.timedelta(seconds=500)


@pytest.mark.parametrize("queue", ["a b", "mail\n", "*", "a,b"])
def test_dispatch_to_a_malformed_queue_name_is_400_on_the_queue_field(api, queue):
    body = assert_error(post(api, job="demo.jobs.SyncProfile", args=[7], queue=queue), 400,
                        "invalid")
    assert f"{queue!r} is not a queue name" in body["errors"]["queue"][0]
    assert not QueuedJob.objects.exists()


def test_dispatch_unique_job_twice_is_skipped(api, store_alias):
    assert post(api, job="tests.operate.UniqueReport", args=[1]).status_code == 201
    second = post(api, job="tests.operate.UniqueReport", args=[1])
    assert second.status_code == 200
    assert second.json() == {"skipped": "unique", "job": "tests.operate.UniqueReport"}
    assert QueuedJob.objects.count() == 1


def test_an_unknown_and_a_registered_but_not_dispatchable_job_get_the_same_answer(api):
    # Job-name discovery: whether a name is registered must not show over HTTP.
    unknown = assert_error(post(api, job="no.such.Job"), 403, "not_dispatchable")
    listed_not = assert_error(post(api, job="tests.support.jobs.Noop"), 403, "not_dispatchable")
    assert unknown["detail"] == ("Job 'no.such.Job' is not dispatchable over HTTP: "
                                 "JOBGUARD['API_DISPATCHABLE_JOBS'] does not list it.")
    assert listed_not["detail"] == unknown["detail"].replace("no.such.Job",
                                                             "tests.support.jobs.Noop")
    assert unknown.keys() == listed_not.keys()
    assert not QueuedJob.objects.exists()


def test_dispatch_of_a_listed_job_that_is_not_registered_is_400(api):
    with override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                     "API_DISPATCHABLE_JOBS": ["no.such.Job"]}):
        body = assert_error(post(api, job="no.such.Job"), 400, "invalid")
    assert "No job is registered as 'no.such.Job'" in body["errors"]["job"][0]


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"args": []}, "args", "missing a required argument: 'profile_id'"),
    ({"args": [1, 2]}, "args", "too many positional arguments"),
    ({"kwargs": {"profile_id": 1, "extra": 2}}, "kwargs", "unexpected keyword argument"),
    ({"args": ["seven"]}, "args", "args[0] (profile_id) must be int, not str"),
    ({"kwargs": {"profile_id": True}}, "kwargs", "profile_id must be int, not bool"),
    ({"args": "notalist"}, "args", "Expected a list"),
    ({"kwargs": [1]}, "kwargs", "Expected a dictionary"),
    ({"args": [{"__jobguard__": "model", "model": "auth.user", "pk": 1}]}, "args",
     "reserved key"),
    ({"args": ["a\x00b"]}, "args", "NUL character"),
    ({"args": [1], "delay": -1}, "delay", "greater than or equal to 0"),
    ({"args": [1], "delay": 10**12}, "delay", "less than or equal to"),
    ({"args": [1], "priority": 101}, "priority", "less than or equal to 100"),
    ({"args": [1], "queue": ""}, "queue", "may not be blank"),
    ({"args": [1], "queue": "q" * 101}, "queue", "no more than 100"),
])
def test_dispatch_bad_arguments_are_400_naming_the_field(api, body, field, message):
    response = post(api, job="demo.jobs.SyncProfile", **body)
    errors = assert_error(response, 400, "invalid")["errors"]
    assert message in " ".join(errors[field]), errors
    assert not QueuedJob.objects.exists()


def test_dispatch_checks_plain_annotations_only(api):
    ok = post(api, job="tests.operate.Typed", args=[1], kwargs={"ratio": 2, "label": None,
                                                                "tags": ["a"]})
    assert ok.status_code == 201, ok.content
    bad = post(api, job="tests.operate.Typed", kwargs={"count": 1, "ratio": "x", "label": 3})
    errors = assert_error(bad, 400)["errors"]["kwargs"]
    assert errors == ["ratio must be float, not str.", "label must be str | None, not int."]


def test_dispatch_missing_job_field_and_bad_bodies(api):
    assert "job" in assert_error(post(api), 400, "invalid")["errors"]
    assert_error(api.post(API + "dispatch/", "{not json", content_type="application/json"),
                 400, "parse_error")
    assert_error(api.post(API + "dispatch/", "job=x", content_type="text/plain"), 415,
                 "unsupported_media_type")
    body = assert_error(api.post(API + "dispatch/", [1], format="json"), 400, "invalid")
    assert "non_field_errors" in body["errors"]


def test_dispatch_payload_too_large_is_400(api):
    settings = {**jobguard_settings.user_settings, "API_DISPATCHABLE_JOBS": DISPATCHABLE,
                "MAX_PAYLOAD_BYTES": 100}
    with override_settings(JOBGUARD=settings):
        body = assert_error(post(api, job="demo.jobs.send_welcome_email",
                                 args=["x" * 200]), 400, "invalid")
    assert "MAX_PAYLOAD_BYTES" in body["errors"]["non_field_errors"][0]


# -- schema --------------------------------------------------------------------------------


def test_openapi_schema_is_served_valid_and_complete(api):
    from drf_spectacular.validation import validate_schema

    response = api.get(API + "schema/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    schema = response.json()
    validate_schema(schema)
    assert schema["info"]["title"] == "django-jobguard API"
    operations = {(method.upper(), path) for path, item in schema["paths"].items()
                  for method in item}
    expected = {
        ("GET", "/jobguard/api/jobs/"), ("GET", "/jobguard/api/jobs/{id}/"),
        ("DELETE", "/jobguard/api/jobs/{id}/"), ("GET", "/jobguard/api/failed-jobs/"),
        ("GET", "/jobguard/api/failed-jobs/{id}/"), ("DELETE", "/jobguard/api/failed-jobs/{id}/"),
        ("POST", "/jobguard/api/failed-jobs/{id}/retry/"),
        ("POST", "/jobguard/api/failed-jobs/retry-all/"), ("GET", "/jobguard/api/locks/"),
        ("GET", "/jobguard/api/locks/{key}/"), ("DELETE", "/jobguard/api/locks/{key}/"),
        ("GET", "/jobguard/api/throttles/"), ("GET", "/jobguard/api/throttles/{key}/"),
        ("DELETE", "/jobguard/api/throttles/{key}/"), ("GET", "/jobguard/api/stats/"),
        ("GET", "/jobguard/api/stats/history/"),
        ("GET", "/jobguard/api/schedules/"), ("GET", "/jobguard/api/batches/"),
        ("GET", "/jobguard/api/batches/{id}/"), ("POST", "/jobguard/api/batches/{id}/cancel/"),
        ("POST", "/jobguard/api/dispatch/"), ("GET", "/jobguard/api/queues/paused/"),
        ("POST", "/jobguard/api/queues/{queue}/pause/"),
        ("POST", "/jobguard/api/queues/{queue}/resume/"),
        ("POST", "/jobguard/api/jobs/{id}/cancel/"),
        ("POST", "/jobguard/api/jobs/{id}/requeue/"), ("POST", "/jobguard/api/jobs/delete/"),
        ("POST", "/jobguard/api/failed-jobs/retry/"),
        ("POST", "/jobguard/api/failed-jobs/delete/"),
        ("GET", "/jobguard/api/runs/"), ("GET", "/jobguard/api/runs/{id}/"),
        ("GET", "/jobguard/api/runs/statistics/"),
        ("GET", "/jobguard/api/workers/"), ("GET", "/jobguard/api/workers/{id}/"),
        ("POST", "/jobguard/api/workers/{id}/quiet/"), ("POST", "/jobguard/api/workers/{id}/stop/"),
        ("POST", "/jobguard/api/schedules/{name}/run/"),
    }
    assert operations == expected
    dispatch = schema["paths"]["/jobguard/api/dispatch/"]["post"]
    assert {"200", "201", "400", "403"} <= set(dispatch["responses"])
    params = {p["name"] for p in schema["paths"]["/jobguard/api/jobs/"]["get"]["parameters"]}
    assert {"queue", "state", "name", "page", "page_size"} <= params


def test_schema_generation_has_no_warnings(capsys):
    from django.urls import include, path
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    from django_jobguard.api import urls

    GENERATOR_STATS.reset()
    SchemaGenerator(patterns=[path("api/", include(urls.endpoint_patterns))]).get_schema(
        request=None, public=True)
    assert not GENERATOR_STATS, capsys.readouterr().err


def test_unimportable_permission_class_is_a_system_check_error():
    from django_jobguard.checks import check_settings

    with override_settings(JOBGUARD={"API_PERMISSION_CLASSES": ["no.such.Permission"]}):
        errors = check_settings()
    assert [e.id for e in errors] == ["jobguard.E006"]
    assert "no.such.Permission" in errors[0].msg


def test_schema_as_yaml_and_method_not_allowed(api):
    response = api.get(API + "schema/", {"format": "yaml"})
    assert response.status_code == 200 and response.content.startswith(b"openapi: 3")
    assert_error(api.put(API + "stats/"), 405, "method_not_allowed")
    assert_error(api.get(API + "no/such/thing/"), 404, "not_found")


@pytest.mark.parametrize("depth", [201, 5_000, 100_000])
def test_dispatch_a_body_nested_too_deep_is_400_not_500(api, depth):
    body = '{"job": "demo.jobs.SyncProfile", "args": [' + "[" * depth + "]" * depth + "]}"
    assert_error(api.post(API + "dispatch/", body, content_type="application/json"),
                 400, "parse_error")
    assert not QueuedJob.objects.exists()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_dispatch_nan_and_infinity_are_400(api, value):
    body = '{"job": "demo.jobs.SyncProfile", "args": [' + value + "]}"
    assert_error(api.post(API + "dispatch/", body, content_type="application/json"),
                 400, "parse_error")
    assert not QueuedJob.objects.exists()


# -- batches -------------------------------------------------------------------------------


def test_batches_list_detail_and_cancel(api):
    from django_jobguard import batch
    from tests.support.flow_jobs import Step

    row = batch([Step("a"), Step("b")], name="two").dispatch()
    listed = api.get(API + "batches/").json()
    assert listed["count"] == 1
    one = listed["results"][0]
    assert (one["id"], one["name"], one["status"], one["total_jobs"], one["pending_jobs"],
            one["processed_jobs"], one["progress"]) == (str(row.id), "two", "running", 2, 2,
                                                         0, 0.0)
    assert api.get(f"{API}batches/{row.id}/").json()["id"] == str(row.id)
    cancelled = api.post(f"{API}batches/{row.id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling"
    assert_error(api.post(f"{API}batches/{row.id}/cancel/"), 409, "not_running")
    assert_error(api.get(f"{API}batches/{uuid.uuid4()}/"), 404, "not_found")
