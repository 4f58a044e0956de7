"""The API asks what the admin asks: staff status and the model permission of each endpoint.

Issue 12 item 6: with ``IsAdminUser`` a staff user holding no permission could cancel jobs,
retry every failed job, force-release locks and dispatch. The table below is the spec, written
out here rather than read from the views, so a view that loosens its permission fails.
"""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_jobguard.conf import jobguard_settings
from tests.support.operate import API, DISPATCHABLE, ENDPOINTS, assert_error, user_with

pytestmark = pytest.mark.django_db

#: (method, path) → the one model permission that opens it.
NEEDED = {
    ("get", "jobs/"): "view_queuedjob",
    ("get", "stats/"): "view_queuedjob",
    ("get", "schema/"): "view_queuedjob",
    ("delete", "jobs/"): "delete_queuedjob",
    ("post", "cancel/"): "change_queuedjob",
    ("get", "failed-jobs/"): "view_failedjob",
    ("delete", "failed-jobs/"): "delete_failedjob",
    ("post", "retry/"): "change_failedjob",
    ("post", "failed-jobs/retry-all/"): "change_failedjob",
    ("post", "failed-jobs/delete/"): "delete_failedjob",
    ("post", "jobs/delete/"): "delete_queuedjob",
    ("post", "requeue/"): "change_queuedjob",
    ("get", "locks/"): "view_lock",
    ("delete", "locks/"): "change_lock",
    ("get", "throttles/"): "view_throttle",
    ("delete", "throttles/"): "change_throttle",
    ("get", "queues/paused/"): "view_pausedqueue",
    ("post", "pause/"): "change_pausedqueue",
    ("post", "resume/"): "change_pausedqueue",
    ("get", "schedules/"): "view_scheduletick",
    ("post", "dispatch/"): "add_queuedjob",
    ("get", "batches/"): "view_batch",
    ("post", "batches/"): "change_batch",
    ("get", "runs/"): "view_finishedrun",
    ("get", "workers/"): "view_worker",
    ("post", "quiet/"): "quiet_worker",
    ("post", "stop/"): "stop_worker",
    ("post", "run/"): "run_schedule",
}


def needed(method: str, path: str) -> str:
    """The permission of the longest matching table entry (a path's prefix or suffix)."""
    matches = [(len(key), codename) for (m, key), codename in NEEDED.items()
               if m == method and (path.startswith(key) or path.endswith(key))]
    assert matches, f"no permission in the table for {method.upper()} {path}"
    return max(matches)[1]


@pytest.fixture(autouse=True)
def _dispatchable():
    with override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                     "API_DISPATCHABLE_JOBS": DISPATCHABLE}):
        yield


def call(user, method: str, path: str):
    client = APIClient()
    client.force_authenticate(user)
    body = {"job": DISPATCHABLE[0]} if path == "dispatch/" else None
    return getattr(client, method)(API + path, body, format="json" if body else None)


def test_the_default_is_the_admin_permissions():
    assert jobguard_settings.API_PERMISSION_CLASSES == [
        "django_jobguard.api.permissions.JobGuardAdminPermissions"]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_staff_without_permissions_is_refused(method, path):
    response = call(user_with("bare", staff=True), method, path)
    assert_error(response, 403, "permission_denied")


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_staff_with_another_permission_is_refused(method, path):
    others = {codename for codename in NEEDED.values() if codename != needed(method, path)}
    response = call(user_with("other", *sorted(others), staff=True), method, path)
    assert_error(response, 403, "permission_denied")


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_staff_with_the_permission_gets_through(method, path):
    response = call(user_with("ops", needed(method, path), staff=True), method, path)
    assert response.status_code != 403, response.content


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_the_permission_without_staff_status_is_refused(method, path):
    response = call(user_with("outsider", needed(method, path), staff=False), method, path)
    assert_error(response, 403, "permission_denied")


def test_superuser_gets_through_and_unknown_paths_stay_404(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    assert client.get(API + "locks/").status_code == 200
    assert_error(client.get(API + "no-such-endpoint/"), 404)
    client.force_authenticate(user_with("viewer", "view_lock", staff=True))
    assert_error(client.get(API + "no-such-endpoint/"), 404)
