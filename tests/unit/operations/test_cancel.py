"""Cancel: a waiting job is deleted and its unique lock freed; a running job is asked to
stop, sees ``self.cancelled`` and ends as cancelled (not failed); clear errors otherwise;
the admin, the API and the command, each with its permission check."""

from __future__ import annotations

import uuid

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from django_jobguard import dispatch, operations, queue
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.worker import Worker, WorkerOptions
from tests.support import jobs
from tests.support.operate import API, UniqueReport, assert_error, failed_job, user_with

pytestmark = pytest.mark.django_db


def _claimed(job, queue_name: str = "default"):
    """Dispatch ``job`` and claim it as worker ``w1`` (it is then running)."""
    dispatch(job, queue=queue_name)
    [row] = queue.claim([queue_name], worker_id="w1")
    return row


def test_a_waiting_job_is_deleted_and_its_unique_lock_freed():
    first = UniqueReport(3).dispatch()
    assert not UniqueReport(3).dispatch()  # the lock holds
    assert operations.cancel_job(str(first.id)) == operations.DELETED
    assert not QueuedJob.objects.exists()
    assert UniqueReport(3).dispatch()  # the lock was freed


def test_a_running_job_is_asked_to_stop_and_ends_as_cancelled():
    from demo.models import JobRun

    row = _claimed(jobs.Cooperative("c", steps=5, seconds=0))
    assert operations.cancel_job(str(row.id), actor="tester") == operations.STOPPING
    assert QueuedJob.objects.get(id=row.id).cancel_requested_at is not None
    worker = Worker(WorkerOptions(queues=["default"]))
    worker.id = "w1"
    worker.pipeline.worker_id = "w1"
    assert worker.process(row) == "CANCELLED"
    assert JobRun.objects.get(label="c").key == "cancelled"
    assert not QueuedJob.objects.exists()
    assert not FailedJob.objects.exists()  # cancelled, not failed


def test_a_cancelled_job_that_went_back_to_the_queue_does_not_run_again():
    row = _claimed(jobs.Noop(1))
    operations.cancel_job(str(row.id))
    queue.release(row)  # e.g. it raised with tries left before it looked
    [again] = queue.claim(["default"], worker_id="w2")
    worker = Worker(WorkerOptions(queues=["default"]))
    worker.id = worker.pipeline.worker_id = "w2"
    assert worker.process(again) == "CANCELLED"
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_cancel_of_a_job_that_is_not_queued_says_why():
    failed = failed_job()
    with pytest.raises(operations.JobNotQueuedError, match="it failed at .* failed jobs") as e:
        operations.cancel_job(str(failed.id))
    assert e.value.finished
    with pytest.raises(operations.JobNotQueuedError, match="not queued") as e:
        operations.cancel_job(str(uuid.uuid4()))
    assert not e.value.finished


def test_command_cancels_and_reports_errors(capsys):
    waiting = dispatch(jobs.Noop(1))
    running = _claimed(jobs.Noop(2), "busy")
    call_command("jobs_cancel", str(waiting.id), str(running.id))
    out = capsys.readouterr().out
    assert f"Deleted job {waiting.id}." in out
    assert f"Asked running job {running.id} to stop." in out
    with pytest.raises(CommandError, match="not a job id"):
        call_command("jobs_cancel", "nope")
    with pytest.raises(CommandError, match="cannot be cancelled"):
        call_command("jobs_cancel", str(waiting.id))


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_api_cancels_waiting_and_running_jobs(admin_user):
    api = _api(admin_user)
    waiting = dispatch(jobs.Noop(1))
    running = _claimed(jobs.Noop(2), "busy")
    response = api.post(f"{API}jobs/{waiting.id}/cancel/")
    assert response.json() == {"id": str(waiting.id), "result": "deleted"}
    response = api.post(f"{API}jobs/{running.id}/cancel/")
    assert response.json() == {"id": str(running.id), "result": "stopping"}
    body = api.get(f"{API}jobs/{running.id}/").json()
    assert body["cancel_requested_at"] is not None
    assert_error(api.post(f"{API}jobs/{failed_job().id}/cancel/"), 409, "not_queued")
    assert_error(api.post(f"{API}jobs/{uuid.uuid4()}/cancel/"), 404, "not_found")
    assert_error(api.post(f"{API}jobs/not-a-uuid/cancel/"), 404, "not_found")


def test_api_cancel_needs_the_change_permission(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "API_PERMISSION_CLASSES": [
        "django_jobguard.api.permissions.JobGuardModelPermissions"]}
    waiting = dispatch(jobs.Noop(1))
    viewer = _api(user_with("viewer", "view_queuedjob"))
    assert_error(viewer.post(f"{API}jobs/{waiting.id}/cancel/"), 403)
    assert QueuedJob.objects.filter(id=waiting.id).exists()
    changer = _api(user_with("changer", "change_queuedjob"))
    assert changer.post(f"{API}jobs/{waiting.id}/cancel/").status_code == 200


def test_admin_cancel_action_and_its_permission(admin_user):
    waiting = dispatch(jobs.Noop(1))
    running = _claimed(jobs.Noop(2), "busy")
    changelist = reverse("admin:django_jobguard_queuedjob_changelist")
    viewer = Client()
    viewer.force_login(user_with("viewer", "view_queuedjob"))
    viewer.post(changelist, {"action": "cancel",
                             "_selected_action": [str(waiting.id)]})
    assert QueuedJob.objects.filter(id=waiting.id).exists()  # no change permission
    client = Client()
    client.force_login(admin_user)
    response = client.post(changelist, {"action": "cancel", "_selected_action": [
        str(waiting.id), str(running.id)]}, follow=True)
    text = response.content.decode()
    assert "1 waiting job was deleted." in text
    assert "1 running job was asked to stop." in text
    assert "cancel requested" in client.get(changelist).content.decode()
