"""The ``view_job_arguments`` permission (issue 31): payloads may hold personal data, so the
admin and the API show jobs, failed jobs, runs and results without their arguments, and
refuse searches by argument, to users who lack it. Superusers have it."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from django_jobguard import Job
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import VIEW_ARGUMENTS, FailedJob, JobResult, may_view_arguments
from tests.support import jobs
from tests.support.inprocess import work
from tests.support.operate import API, assert_error, user_with

pytestmark = pytest.mark.django_db

SECRET = "alice@example.com"
VIEW_ALL = ("view_queuedjob", "view_failedjob", "view_finishedrun", "view_jobresult")


class Notify(Job):
    name = "tests.argperm.Notify"

    def __init__(self, email: str) -> None:
        self.email = email

    def handle(self) -> None:
        raise RuntimeError("the mail server said no")  # the error names no argument


@pytest.fixture
def rows():
    """A queued job, a failed job and a finished run, each with the secret argument."""
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "HISTORY": "all"}):
        Notify(SECRET).dispatch()
        work()
    jobs.Noop(7).dispatch(delay=3600)
    queued = jobs.Noop(SECRET).dispatch(delay=3600).id
    failed = str(FailedJob.objects.get().id)
    return {"queued": queued, "failed": failed}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_superusers_have_it_and_staff_only_when_granted(admin_user):
    assert may_view_arguments(admin_user) and may_view_arguments(None) is False
    plain = user_with("plain", *VIEW_ALL)
    assert not may_view_arguments(plain)
    granted = user_with("granted", *VIEW_ALL, "view_job_arguments")
    assert granted.has_perm(VIEW_ARGUMENTS) and may_view_arguments(granted)


@pytest.mark.parametrize(("page", "kind"), [
    ("/admin/django_jobguard/queuedjob/", None),
    ("/admin/django_jobguard/failedjob/", None),
    ("/admin/django_jobguard/finishedrun/", None),
    ("/admin/django_jobguard/queuedjob/{queued}/change/", "queued"),
    ("/admin/django_jobguard/failedjob/{failed}/change/", "failed"),
])
def test_admin_pages_hide_arguments_without_the_permission(rows, page, kind):
    url = page.format(**rows)
    hidden = client_for(user_with("plain", *VIEW_ALL)).get(url)
    assert hidden.status_code == 200
    assert SECRET not in hidden.content.decode()
    shown = client_for(user_with("granted", *VIEW_ALL, "view_job_arguments")).get(url)
    assert shown.status_code == 200
    assert SECRET in shown.content.decode()


def test_admin_run_detail_and_result_detail_hide_arguments(rows):
    from django_jobguard.models import FinishedRun

    run = FinishedRun.objects.filter(state="FAILED").get()
    result = JobResult.objects.create(id=run.job_id, name="x", queue="default",
                                      status="READY", payload={"args": [SECRET]})
    plain = client_for(user_with("plain", *VIEW_ALL))
    granted = client_for(user_with("granted", *VIEW_ALL, "view_job_arguments"))
    for url in (f"/admin/django_jobguard/finishedrun/{run.id}/change/",
                f"/admin/django_jobguard/jobresult/{result.id}/change/"):
        assert SECRET not in plain.get(url).content.decode()
        assert SECRET in granted.get(url).content.decode()


def test_admin_search_by_argument_needs_the_permission(rows):
    plain = client_for(user_with("plain", *VIEW_ALL))
    page = plain.get("/admin/django_jobguard/queuedjob/", {"q": "n=7"})
    assert list(page.context["cl"].result_list) == []
    assert "needs the permission to view job arguments" in page.content.decode()
    runs = plain.get("/admin/django_jobguard/finishedrun/", {"q": "alice"})
    assert list(runs.context["cl"].result_list) == []  # no text search in arguments either
    granted = client_for(user_with("granted", *VIEW_ALL, "view_job_arguments"))
    assert len(granted.get("/admin/django_jobguard/queuedjob/", {"q": "n=7"})
               .context["cl"].result_list) == 1
    assert len(granted.get("/admin/django_jobguard/finishedrun/", {"q": "alice"})
               .context["cl"].result_list) == 1


def test_api_responses_null_the_arguments_without_the_permission(rows):
    plain, granted = APIClient(), APIClient()
    plain.force_authenticate(user_with("plain", *VIEW_ALL))
    granted.force_authenticate(user_with("granted", *VIEW_ALL, "view_job_arguments"))
    for url, field in ((API + "jobs/", "payload"), (API + "failed-jobs/", "payload"),
                       (API + "runs/", "arguments"), (API + f"jobs/{rows['queued']}/", "payload"),
                       (API + f"failed-jobs/{rows['failed']}/", "payload")):
        hidden = plain.get(url)
        assert hidden.status_code == 200, hidden.content
        body = hidden.json()
        for row in body.get("results", [body]):
            assert row[field] is None
        assert SECRET not in hidden.content.decode()
        assert SECRET in granted.get(url).content.decode()


def test_api_search_by_argument_needs_the_permission(rows):
    plain = APIClient()
    plain.force_authenticate(user_with("plain", *VIEW_ALL, "change_failedjob"))
    assert_error(plain.get(API + "jobs/", {"kwargs__n": "7"}), 403, "permission_denied")
    assert_error(plain.get(API + "failed-jobs/", {"args__0": '"x"'}), 403, "permission_denied")
    assert_error(plain.post(API + "failed-jobs/retry/?args__0=1"), 403, "permission_denied")
    assert_error(plain.get(API + "runs/", {"arguments": "alice"}), 403, "permission_denied")
    assert_error(plain.get(API + "runs/", {"kwargs__n": "7"}), 403, "permission_denied")
    assert plain.get(API + "jobs/", {"name": "tests.support.jobs.Noop"}).status_code == 200
