"""The API's search filters, bulk endpoints (all matches, counts) and requeue."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from django_jobguard.models import FailedJob, QueuedJob, Worker
from tests.support.operate import API, assert_error, reserved, user_with, waiting

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(admin_user) -> APIClient:
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


def failed(invoice_id, *, queue_name="default", exception="builtins.RuntimeError"):
    return FailedJob.objects.create(
        name="tests.support.jobs.Boom", queue=queue_name, attempts=1,
        payload={"args": [invoice_id], "kwargs": {"invoice_id": invoice_id}},
        exception_class=exception, message="boom")


def test_lists_filter_by_argument_values_exception_and_name(api):
    a = failed(7, exception="builtins.TimeoutError")
    failed("7")
    failed(8)
    body = api.get(API + "failed-jobs/", {"kwargs__invoice_id": "7"}).json()
    assert [row["id"] for row in body["results"]] == [str(a.id)]
    assert body["count"] == 1
    body = api.get(API + "failed-jobs/", {"exception": "TimeoutError", "args__0": "7"}).json()
    assert [row["id"] for row in body["results"]] == [str(a.id)]
    job = QueuedJob.objects.create(name="tests.support.jobs.Noop",
                                   payload={"args": [], "kwargs": {"customer": {"id": 3}}})
    waiting()
    body = api.get(API + "jobs/", {"kwargs__customer__id": "3"}).json()
    assert [row["id"] for row in body["results"]] == [str(job.id)]
    assert body["results"][0]["display_name"] == "tests.support.jobs.Noop"


@pytest.mark.parametrize(("path", "params", "field", "says"), [
    ("failed-jobs/", {"kwargs__invoice_id": "seven"}, "kwargs__invoice_id", "not valid JSON"),
    ("jobs/", {"args__x": "1"}, "args__x", "numbered from 0"),
    ("jobs/", {"queue": "emials"}, "queue", "Unknown queue 'emials'"),
    ("failed-jobs/retry/", {"kwargs__id": "{"}, "kwargs__id", "not valid JSON"),
    ("failed-jobs/delete/", {"queue": "nope"}, "queue", "Unknown queue"),
    ("jobs/delete/", {"kwargs__id": "[1]"}, "kwargs__id", "compare one value"),
])
def test_bad_filters_are_a_400_naming_the_parameter(api, path, params, field, says):
    failed(1)
    method = api.get if path.endswith("jobs/") else api.post
    query = "&".join(f"{k}={v}" for k, v in params.items())
    body = assert_error(method(f"{API}{path}?{query}"), 400, "invalid")
    assert says in body["errors"][field][0]
    assert FailedJob.objects.count() == 1 and not QueuedJob.objects.exists()


@pytest.mark.parametrize(("method", "path"), [
    ("get", "jobs/"), ("get", "failed-jobs/"), ("post", "failed-jobs/retry/"),
    ("post", "failed-jobs/delete/"), ("post", "jobs/delete/")])
def test_an_argument_lookup_given_twice_is_a_400_not_its_last_value(api, method, path):
    failed(1)
    failed(2)
    waiting(invoice_id=2)
    response = getattr(api, method)(f"{API}{path}?kwargs__invoice_id=1&kwargs__invoice_id=2")
    body = assert_error(response, 400, "invalid")
    assert body["errors"]["kwargs__invoice_id"] == ["kwargs__invoice_id is given twice."]
    assert FailedJob.objects.count() == 2 and QueuedJob.objects.count() == 1


def test_an_unknown_parameter_is_still_refused(api):
    body = assert_error(api.post(API + "failed-jobs/retry/?exeption=X"), 400, "unknown_field")
    assert "did you mean 'exception'?" in body["detail"]


def test_bulk_retry_retries_every_match_and_returns_the_count(api):
    matching = [failed(7) for _ in range(12)]
    other = failed(8)
    response = api.post(API + "failed-jobs/retry/?kwargs__invoice_id=7")
    assert response.status_code == 200, response.content
    assert response.json() == {"retried": 12, "skipped": 0}
    assert set(QueuedJob.objects.values_list("id", flat=True)) == {r.id for r in matching}
    assert list(FailedJob.objects.values_list("id", flat=True)) == [other.id]
    # a body is refused (the filters are query parameters, as on the list)
    assert_error(api.post(API + "failed-jobs/retry/", {"queue": "x"}, format="json"), 400,
                 "unknown_field")


def test_bulk_forget_and_delete(api):
    for _ in range(3):
        failed(1, exception="builtins.TimeoutError")
    keep = failed(1)
    assert api.post(API + "failed-jobs/delete/?exception=TimeoutError").json() == {
        "deleted": 3}
    assert list(FailedJob.objects.values_list("id", flat=True)) == [keep.id]
    for _ in range(4):
        waiting(queue_name="emails")
    busy = reserved(queue_name="emails2")
    QueuedJob.objects.filter(id=busy.id).update(queue="emails")
    assert api.post(API + "jobs/delete/?queue=emails").json() == {"deleted": 4, "skipped": 1}
    assert list(QueuedJob.objects.values_list("id", flat=True)) == [busy.id]


def test_bulk_endpoints_need_their_permission_and_do_nothing_without(client):
    job = failed(7)
    queued = waiting()
    api = APIClient()
    api.force_authenticate(user_with("changer", "view_failedjob", "change_failedjob",
                                     "view_queuedjob", "change_queuedjob"))
    assert_error(api.post(API + "failed-jobs/delete/"), 403, "permission_denied")
    assert_error(api.post(API + "jobs/delete/"), 403, "permission_denied")
    api.force_authenticate(user_with("viewer", "view_failedjob", "view_queuedjob"))
    assert_error(api.post(API + "failed-jobs/retry/"), 403, "permission_denied")
    assert_error(api.post(API + f"jobs/{queued.id}/requeue/"), 403, "permission_denied")
    assert FailedJob.objects.filter(id=job.id).exists()
    assert list(QueuedJob.objects.values_list("id", flat=True)) == [queued.id]
    anonymous = APIClient().post(API + "failed-jobs/retry/")
    assert_error(anonymous, 401, "not_authenticated")
    assert anonymous["WWW-Authenticate"] == 'Basic realm="api"'


def test_requeue_an_orphaned_reservation_but_never_a_live_workers_job(api):
    stale = reserved(worker_id="otherhost:5:dead", queue_name="a")
    Worker.objects.filter(id="otherhost:5:dead").update(last_seen_at="2000-01-01T00:00:00Z")
    live = reserved(worker_id="otherhost:5:live", queue_name="b")
    idle = waiting()
    response = api.post(f"{API}jobs/{stale.id}/requeue/")
    assert response.json() == {"id": str(stale.id), "result": "requeued"}
    assert QueuedJob.objects.with_state().get(id=stale.id).state == "waiting"
    body = assert_error(api.post(f"{API}jobs/{live.id}/requeue/"), 409, "worker_alive")
    assert "otherhost:5:live, which is alive" in body["detail"]
    assert QueuedJob.objects.with_state().get(id=live.id).state == "reserved"
    assert_error(api.post(f"{API}jobs/{idle.id}/requeue/"), 409, "not_reserved")
    # Issue 27 (3): its worker's row is gone (housekeeping, or deleted by hand), its lease fresh.
    Worker.objects.filter(id="otherhost:5:live").delete()
    body = assert_error(api.post(f"{API}jobs/{live.id}/requeue/"), 409, "worker_alive")
    assert "has no worker row but renewed the job's lease" in body["detail"]
    assert QueuedJob.objects.with_state().get(id=live.id).state == "reserved"
    assert_error(api.post(f"{API}jobs/00000000-0000-0000-0000-000000000009/requeue/"), 404,
                 "not_found")
    assert_error(api.post(f"{API}jobs/not-a-uuid/requeue/"), 404, "not_found")


def test_jobs_list_and_detail_flag_a_reservation_whose_worker_is_gone(api):
    stale = reserved(worker_id="otherhost:5:dead", queue_name="a")
    Worker.objects.filter(id="otherhost:5:dead").update(last_seen_at="2000-01-01T00:00:00Z")
    live = reserved(worker_id="otherhost:5:live", queue_name="b")
    idle = waiting()
    detail = api.get(f"{API}jobs/{stale.id}/").json()
    assert (detail["stale"], detail["stale_reason"]) == (True, "worker otherhost:5:dead is gone")
    for job in (live, idle):
        detail = api.get(f"{API}jobs/{job.id}/").json()
        assert (detail["stale"], detail["stale_reason"]) == (False, "")
    listed = {row["id"]: (row["stale"], row["stale_reason"])
              for row in api.get(API + "jobs/").json()["results"]}
    assert listed == {str(stale.id): (True, "worker otherhost:5:dead is gone"),
                      str(live.id): (False, ""), str(idle.id): (False, "")}


def test_a_django_task_is_listed_and_filtered_by_its_own_name(api):
    pytest.importorskip("django_jobguard.tasks_backend")
    row = QueuedJob.objects.create(name="django_jobguard.task", payload={
        "args": [], "kwargs": {"task": "tests.support.tasks.add", "backend": "default",
                               "args": [1, 2], "kwargs": {}}})
    waiting()
    body = api.get(API + "jobs/", {"name": "tests.support.tasks.add"}).json()
    assert [r["id"] for r in body["results"]] == [str(row.id)]
    assert body["results"][0]["display_name"] == "tests.support.tasks.add"
    assert body["results"][0]["name"] == "django_jobguard.task"
