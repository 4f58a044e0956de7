"""The admin's search and bulk actions (all that match, confirmed with a count), stale
reservations and requeue, the Workers page verdicts, confirmations of destructive actions,
the failed job's Retry button, django.tasks names and times to the second."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

from django_jobguard import get_store
from django_jobguard.models import FailedJob, QueuedJob, Worker
from tests.support.operate import reserved, user_with, waiting

pytestmark = pytest.mark.django_db

QUEUED = "/admin/django_jobguard/queuedjob/"
FAILED = "/admin/django_jobguard/failedjob/"
WORKERS = "/admin/django_jobguard/worker/"
RESULTS = "/admin/django_jobguard/jobresult/"
LOCKS = "/admin/django_jobguard/lock/"


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def failed(invoice_id, *, queue_name="default", exception="builtins.RuntimeError",
           name="tests.support.jobs.Boom") -> FailedJob:
    return FailedJob.objects.create(
        name=name, queue=queue_name, payload={"args": [], "kwargs": {"invoice_id": invoice_id}},
        attempts=1, exception_class=exception, message="boom")


def page_ids(response) -> list[str]:
    return [str(row.id) for row in response.context["cl"].result_list]


def act_on_all(client, url: str, query: str, action: str, **extra):
    """What the changelist sends after "Select all N": the page's ids and select_across."""
    listing = client.get(f"{url}?{query}")
    return client.post(f"{url}?{query}", {"action": action, "select_across": "1",
                                          ACTION_CHECKBOX_NAME: page_ids(listing)[:3],
                                          **extra}, follow=True)


# -- search ---------------------------------------------------------------------------------


def test_search_box_takes_argument_lookups_with_the_other_filters(admin_client):
    a = failed(7, queue_name="billing")
    failed(7, queue_name="default")
    failed(8, queue_name="billing")
    failed("7", queue_name="billing")
    response = admin_client.get(FAILED, {"q": "kwargs__invoice_id=7", "queue": "billing"})
    assert page_ids(response) == [str(a.id)]
    # an argument lookup and plain words together
    response = admin_client.get(FAILED, {"q": 'kwargs__invoice_id="7" boom'})
    assert len(page_ids(response)) == 1
    assert "kwargs__invoice_id=7" in response.content.decode()  # the help text


def test_a_bad_lookup_is_a_message_not_an_error_page(admin_client):
    failed(7)
    response = admin_client.get(FAILED, {"q": "kwargs__invoice_id=seven"})
    assert response.status_code == 200 and page_ids(response) == []
    [message] = messages_of(response)
    assert "kwargs__invoice_id: 'seven' is not valid JSON" in message


def test_an_unknown_queue_says_so(admin_client):
    failed(1, queue_name="billing")
    response = admin_client.get(FAILED, {"queue": "biling"})
    assert response.status_code == 200 and page_ids(response) == []
    assert "Unknown queue 'biling': no job, worker or registered job uses it." in \
        messages_of(response)
    assert messages_of(admin_client.get(FAILED, {"queue": "billing"})) == []


def test_exception_filter_takes_a_class_name(admin_client):
    timeout = failed(1, exception="builtins.TimeoutError")
    failed(2)
    response = admin_client.get(FAILED, {"exception": "TimeoutError"})
    assert page_ids(response) == [str(timeout.id)]
    assert "TimeoutError" in response.content.decode()  # listed in the filter


# -- bulk actions over everything the list matches ------------------------------------------


def test_retry_all_matches_confirms_with_the_count_then_retries_every_match(admin_client):
    matching = [failed(7) for _ in range(60)]  # more than a page (50)
    others = [failed(8) for _ in range(3)]
    confirm = act_on_all(admin_client, FAILED, "q=kwargs__invoice_id%3D7", "retry")
    body = confirm.content.decode()
    assert "Are you sure you want to retry 60 failed jobs?" in body
    assert 'name="select_across" value="1"' in body
    assert "kwargs__invoice_id=7" in body  # the search is shown
    assert len(re.findall(r"<li>tests\.support\.jobs\.Boom \[", body)) == 10  # a sample
    assert FailedJob.objects.count() == 63  # nothing yet

    done = act_on_all(admin_client, FAILED, "q=kwargs__invoice_id%3D7", "retry", post="yes")
    assert "60 jobs are queued again." in messages_of(done)
    assert set(QueuedJob.objects.values_list("id", flat=True)) == {r.id for r in matching}
    assert set(FailedJob.objects.values_list("id", flat=True)) == {r.id for r in others}


def test_forget_all_matches_confirms_with_the_count(admin_client):
    for _ in range(55):
        failed(1, queue_name="billing")
    keep = failed(1)
    confirm = act_on_all(admin_client, FAILED, "queue=billing", "delete_selected")
    assert "Are you sure you want to forget 55 failed jobs?" in confirm.content.decode()
    done = act_on_all(admin_client, FAILED, "queue=billing", "delete_selected", post="yes")
    assert "Successfully forgot 55 failed jobs." in messages_of(done)
    assert list(FailedJob.objects.values_list("id", flat=True)) == [keep.id]


def test_delete_all_matches_counts_only_what_can_be_deleted(admin_client):
    for i in range(52):
        QueuedJob.objects.create(name="tests.support.jobs.Noop", queue="default",
                                 payload={"args": [i % 2], "kwargs": {}})
    busy = reserved(queue_name="default2")
    QueuedJob.objects.filter(id=busy.id).update(payload={"args": [0], "kwargs": {}})
    confirm = act_on_all(admin_client, QUEUED, "q=args__0%3D0", "delete_selected")
    assert "Are you sure you want to delete 26 queued jobs?" in confirm.content.decode()
    assert "1 selected job is reserved by a worker and will not be deleted." in \
        confirm.content.decode()
    done = act_on_all(admin_client, QUEUED, "q=args__0%3D0", "delete_selected", post="yes")
    assert "Successfully deleted 26 queued jobs." in messages_of(done)
    assert QueuedJob.objects.filter(payload__args__0=0).count() == 1  # the reserved one
    assert QueuedJob.objects.filter(payload__args__0=1).count() == 26


def test_bulk_actions_need_their_permissions(client):
    job = failed(7)
    user_with("viewer", "view_failedjob", "view_queuedjob")
    client.login(username="viewer", password="pw")
    listing = client.get(FAILED).content.decode()
    assert 'value="retry"' not in listing and 'value="delete_selected"' not in listing
    for name in ("retry", "delete_selected"):
        client.post(FAILED, {"action": name, "select_across": "1", "post": "yes",
                             ACTION_CHECKBOX_NAME: [str(job.id)]})
    assert FailedJob.objects.filter(id=job.id).exists()
    assert not QueuedJob.objects.exists()
    # change without delete: retry yes, forget no
    user_with("changer", "view_failedjob", "change_failedjob")
    client.login(username="changer", password="pw")
    client.post(FAILED, {"action": "delete_selected", "post": "yes",
                         ACTION_CHECKBOX_NAME: [str(job.id)]})
    assert FailedJob.objects.filter(id=job.id).exists()
    # the queued list: no delete or requeue without delete / change
    orphan = waiting()
    client.login(username="viewer", password="pw")
    for name in ("delete_selected", "requeue"):
        client.post(QUEUED, {"action": name, "post": "yes",
                             ACTION_CHECKBOX_NAME: [str(orphan.id)]})
    assert QueuedJob.objects.filter(id=orphan.id).exists()


# -- stale reservations ---------------------------------------------------------------------


def gone_worker_job(worker_id="otherhost:9:dead") -> QueuedJob:
    row = reserved(worker_id=worker_id, queue_name="stale")
    Worker.objects.filter(id=worker_id).update(last_seen_at="2000-01-01T00:00:00Z")
    return row


def test_a_reservation_of_a_gone_worker_is_flagged_and_can_be_requeued(admin_client):
    stale = gone_worker_job()
    live = reserved(worker_id="otherhost:9:live", queue_name="busy")
    body = admin_client.get(QUEUED).content.decode()
    assert "stale: worker otherhost:9:dead is gone" in body
    assert "stale: worker otherhost:9:live" not in body
    assert "stale: worker otherhost:9:dead is gone" in admin_client.get(
        f"{QUEUED}{stale.id}/change/").content.decode()

    response = admin_client.post(QUEUED, {"action": "requeue", ACTION_CHECKBOX_NAME: [
        str(stale.id), str(live.id)]}, follow=True)
    assert "1 job is queued again." in messages_of(response)
    assert ("1 job is held by a live worker and was not requeued (cancel it instead)."
            in messages_of(response))
    assert QueuedJob.objects.with_state().get(id=stale.id).state == "waiting"
    assert QueuedJob.objects.with_state().get(id=live.id).state == "reserved"


def test_workers_page_says_which_workers_are_gone(admin_client):
    import socket

    Worker.objects.create(id="here:dead", hostname=socket.gethostname(), pid=2**22 + 4321,
                          queues="default")
    Worker.objects.create(id="there:live", hostname="elsewhere", pid=1, queues="default")
    Worker.objects.create(id="there:silent", hostname="elsewhere", pid=2, queues="default")
    Worker.objects.filter(id="there:silent").update(last_seen_at="2000-01-01T00:00:00Z")
    body = admin_client.get(WORKERS).content.decode()
    assert "gone: its process has ended" in body
    assert "gone: no heartbeat for RETRY_AFTER" in body
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", body)  # heartbeat to the second

    def shown(status):
        return {row.id for row in admin_client.get(WORKERS, {"status": status})
                .context["cl"].result_list}

    assert shown("alive") == {"there:live"}
    assert shown("gone") == {"here:dead", "there:silent"}


# -- confirmations and the Retry button -----------------------------------------------------


def test_force_release_of_a_live_jobs_lock_asks_first(admin_client):
    store = get_store()
    job = waiting()
    key = "jobguard:unique:tests.support.jobs.Noop:1"
    store.acquire(key, str(job.id), job_id=str(job.id))
    confirm = admin_client.post(f"{LOCKS}release/", {"store": store.alias, "key": key})
    assert confirm.status_code == 200
    assert "Are you sure you want to force-release lock" in confirm.content.decode()
    assert store.get_lock(key) is not None
    done = admin_client.post(f"{LOCKS}release/", {"store": store.alias, "key": key,
                                                  "confirm": "yes"}, follow=True)
    assert f"Released lock {key}." in messages_of(done)
    assert store.get_lock(key) is None


def test_failed_job_page_has_a_retry_button(admin_client, client):
    job = failed(7)
    page = admin_client.get(f"{FAILED}{job.id}/change/").content.decode()
    assert 'id="jobguard-retry"' in page and f"{FAILED}{job.id}/retry/" in page
    assert admin_client.get(f"{FAILED}{job.id}/retry/").status_code == 405
    user_with("viewer", "view_failedjob")
    client.login(username="viewer", password="pw")
    assert 'id="jobguard-retry"' not in client.get(f"{FAILED}{job.id}/change/").content.decode()
    assert client.post(f"{FAILED}{job.id}/retry/").status_code == 403
    assert FailedJob.objects.filter(id=job.id).exists()

    done = admin_client.post(f"{FAILED}{job.id}/retry/", follow=True)
    assert any("The job is queued again" in m for m in messages_of(done))
    assert QueuedJob.objects.filter(id=job.id).exists()
    again = admin_client.post(f"{FAILED}{job.id}/retry/", follow=True)
    assert "This failed job no longer exists" in messages_of(again)[0]


def test_list_times_show_seconds(admin_client):
    failed(1)
    waiting()
    for url in (FAILED, QUEUED):
        assert re.search(r"<td class=\"field-\w+_display\">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</td>",
                         admin_client.get(url).content.decode()), url


# -- django.tasks names ---------------------------------------------------------------------


def task_row(task: str = "tests.support.tasks.add") -> QueuedJob:
    return QueuedJob.objects.create(name="django_jobguard.task", queue="default", payload={
        "args": [], "kwargs": {"task": task, "backend": "default", "args": [1, 2],
                               "kwargs": {}}})


def test_django_tasks_show_and_filter_by_their_own_name(admin_client):
    pytest.importorskip("django_jobguard.tasks_backend")
    row = task_row()
    plain = waiting()
    response = admin_client.get(QUEUED)
    body = response.content.decode()
    names = re.findall(r'class="field-name_display"><a [^>]*>(.*?)</a>', body)
    assert sorted(name.replace("<wbr>", "") for name in names) == [
        "tests.support.jobs.Noop", "tests.support.tasks.add"]
    assert "?name=tests.support.tasks.add" in body  # the filter lists it
    assert page_ids(admin_client.get(QUEUED, {"name": "tests.support.tasks.add"})) == \
        [str(row.id)]
    assert page_ids(admin_client.get(QUEUED, {"q": "tasks.add"})) == [str(row.id)]
    assert page_ids(admin_client.get(QUEUED, {"q": "tasks.add", "queue": "default"})) == \
        [str(row.id)]
    waiting(queue_name="other")  # a known queue without the task: the search stays inside it
    assert page_ids(admin_client.get(QUEUED, {"q": "tasks.add", "queue": "other"})) == []
    assert str(plain.id) in page_ids(admin_client.get(QUEUED, {"q": "Noop"}))


def test_task_results_show_and_filter_by_the_tasks_name(admin_client):
    pytest.importorskip("django_jobguard.tasks_backend")
    import uuid

    from django_jobguard.models import JobResult

    row = JobResult.objects.create(id=uuid.uuid4(), name="django_jobguard.task",
                                   queue="default", status="READY",
                                   payload={"task": "tests.support.tasks.add", "args": [1, 2]})
    JobResult.objects.create(id=uuid.uuid4(), name="tests.support.jobs.Noop", queue="default",
                             status="READY", payload={})
    names = re.findall(r'class="field-name_display"><a [^>]*>(.*?)</a>',
                       admin_client.get(RESULTS).content.decode())
    assert sorted(name.replace("<wbr>", "") for name in names) == [
        "tests.support.jobs.Noop", "tests.support.tasks.add"]
    assert page_ids(admin_client.get(RESULTS, {"name": "tests.support.tasks.add"})) == \
        [str(row.id)]
