"""Pausing and resuming queues: the operation, the claim that honours it, the commands, the
API and the admin, each with its permission check."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from django_jobguard import dispatch, operations, queue
from django_jobguard.models import PausedQueue
from tests.support import jobs
from tests.support.operate import API, assert_error, user_with, waiting

pytestmark = pytest.mark.django_db


def test_a_paused_queue_gives_no_claims_and_a_resumed_one_does():
    dispatch(jobs.Noop(1), queue="mail")
    dispatch(jobs.Noop(2), queue="other")
    assert operations.pause("mail", actor="tester") is True
    assert operations.pause("mail") is False  # already paused
    assert queue.paused() == {"mail"}
    assert queue.claim(["mail"], worker_id="w1") == []
    # The other queue in the same list is still served.
    assert [row.queue for row in queue.claim(["mail", "other"], worker_id="w1")] == ["other"]
    # A paused queue is not "due", so an idle worker does not spin on it.
    assert queue.seconds_until_due(["mail"]) is None
    operations.resume("mail", actor="tester")
    assert queue.paused() == set()
    claimed = queue.claim(["mail"], worker_id="w1")
    assert [row.queue for row in claimed] == ["mail"]


def test_bad_queue_names_and_resume_of_a_queue_not_paused_say_what_is_wrong():
    with pytest.raises(operations.QueueNameError, match="Invalid queue name 'a b'"):
        operations.pause("a b")
    with pytest.raises(operations.QueueNameError, match="Unknown queue 'nowhere'"):
        operations.pause("nowhere")
    with pytest.raises(operations.QueueNameError, match="'default' is not paused"):
        operations.resume("default")
    assert operations.pause("nowhere", force=True) is True  # ahead of time
    assert PausedQueue.objects.get().queue == "nowhere"


def test_pause_and_resume_are_audit_logged(caplog):
    operations.pause("default", actor="alice")
    operations.resume("default", actor="alice")
    lines = [r.getMessage() for r in caplog.records if r.name == "django_jobguard.operations"]
    assert lines == ["Paused queue 'default' by alice.", "Resumed queue 'default' by alice."]


def test_commands_pause_and_resume(capsys):
    call_command("jobs_pause", "default")
    assert "Paused queue 'default'." in capsys.readouterr().out
    call_command("jobs_pause", "default")
    assert "was paused already" in capsys.readouterr().out
    assert queue.paused() == {"default"}
    call_command("jobs_resume", "default")
    assert "Resumed queue 'default'." in capsys.readouterr().out
    with pytest.raises(CommandError, match="is not paused"):
        call_command("jobs_resume", "default")
    with pytest.raises(CommandError, match="Unknown queue 'typo'") as refused:
        call_command("jobs_pause", "typo")
    assert str(refused.value).endswith("(pass --force to pause it ahead of time).")  # the flag
    call_command("jobs_pause", "typo", "--force")
    assert queue.paused() == {"typo"}


# -- API ---------------------------------------------------------------------------------


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def model_permissions(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "API_PERMISSION_CLASSES": [
        "django_jobguard.api.permissions.JobGuardModelPermissions"]}


def test_api_pauses_lists_and_resumes(admin_user):
    api = _api(admin_user)
    waiting(queue_name="mail")
    response = api.post(f"{API}queues/mail/pause/", {}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["queue"] == "mail"
    assert response.json()["paused_by"] == admin_user.get_username()
    listed = api.get(f"{API}queues/paused/").json()
    assert [row["queue"] for row in listed["results"]] == ["mail"]
    assert api.post(f"{API}queues/mail/resume/").status_code == 204
    assert queue.paused() == set()
    assert_error(api.post(f"{API}queues/mail/resume/"), 404, "not_found")


def test_api_refuses_unknown_and_malformed_queues(admin_user):
    api = _api(admin_user)
    body = assert_error(api.post(f"{API}queues/nowhere/pause/", {}, format="json"), 400)
    assert "Unknown queue 'nowhere'" in body["errors"]["queue"][0]
    assert '(send "force": true to pause it ahead of time)' in body["errors"]["queue"][0]
    assert_error(api.post(f"{API}queues/{'x' * 101}/pause/", {}, format="json"), 400)
    assert_error(api.post(f"{API}queues/default/pause/", {"forse": True}, format="json"), 400,
                 "unknown_field")
    response = api.post(f"{API}queues/nowhere/pause/", {"force": True}, format="json")
    assert response.status_code == 200


def test_api_pause_needs_the_change_permission(model_permissions):
    viewer = _api(user_with("viewer", "view_pausedqueue"))
    assert viewer.get(f"{API}queues/paused/").status_code == 200
    assert_error(viewer.post(f"{API}queues/default/pause/", {}, format="json"), 403)
    operations.pause("default")
    assert_error(viewer.post(f"{API}queues/default/resume/"), 403)
    assert queue.paused() == {"default"}
    changer = _api(user_with("changer", "change_pausedqueue"))
    assert changer.post(f"{API}queues/default/resume/").status_code == 204
    assert_error(_api(user_with("nobody")).get(f"{API}queues/paused/"), 403)


# -- admin -------------------------------------------------------------------------------


def _admin(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_admin_pauses_with_the_add_form_and_resumes_with_the_action(admin_user):
    client = _admin(admin_user)
    add = reverse("admin:django_jobguard_pausedqueue_add")
    response = client.post(add, {"queue": "nowhere"})
    assert response.status_code == 200
    assert "Unknown queue" in response.content.decode()
    assert not PausedQueue.objects.exists()
    response = client.post(add, {"queue": "default"})
    assert response.status_code == 302
    assert queue.paused() == {"default"}
    changelist = reverse("admin:django_jobguard_pausedqueue_changelist")
    assert "default" in client.get(changelist).content.decode()
    response = client.post(changelist, {"action": "resume", "_selected_action": ["default"]})
    assert response.status_code == 302
    assert queue.paused() == set()


def test_admin_pause_and_resume_need_the_change_permission():
    operations.pause("default")
    viewer = _admin(user_with("viewer", "view_pausedqueue"))
    changelist = reverse("admin:django_jobguard_pausedqueue_changelist")
    assert viewer.get(changelist).status_code == 200
    assert viewer.post(reverse("admin:django_jobguard_pausedqueue_add"),
                       {"queue": "other", "force": "on"}).status_code == 403
    viewer.post(changelist, {"action": "resume", "_selected_action": ["default"]})
    assert queue.paused() == {"default"}  # neither paused "other" nor resumed "default"


def test_jobs_pause_says_so_once_without_the_audit_line_in_the_middle(tmp_path):
    """Issue 30 item 6: in a project without LOGGING the audit record went to Python's
    last-resort handler (stderr), so the command printed its message twice. A project that
    routes the logger still gets it (below)."""
    from tests.support.throwaway import make_project, run_in

    make_project(tmp_path)
    assert run_in(tmp_path, "-m", "django", "migrate", "-v", "0").returncode == 0
    done = run_in(tmp_path, "-m", "django", "jobs_pause", "default")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Paused queue 'default'.\n"
    assert "Paused queue" not in done.stderr and " by manage.py" not in done.stderr


def test_the_audit_log_still_reaches_a_project_handler(caplog):
    with caplog.at_level(logging.WARNING, logger="django_jobguard.operations"):
        operations.pause("default", actor="ann")
    assert [r.getMessage() for r in caplog.records] == ["Paused queue 'default' by ann."]


@pytest.mark.django_db(transaction=True)
def test_the_test_projects_console_leaves_the_audit_log_out():
    """The demo and the commands run with testproject's LOGGING (django_jobguard on the
    console): its console handler drops the audit records."""
    from tests.support import run_command

    done = run_command("jobs_pause", "default")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Paused queue 'default'.\n" and "by manage.py" not in done.stderr
