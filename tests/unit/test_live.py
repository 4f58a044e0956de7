"""The live pages' data (the dashboard's live.json) and the live-update bar on every jobguard
page (the script itself runs in tests/integration/test_live_browser.py)."""

from __future__ import annotations

import datetime

import pytest
from django.test import override_settings
from django.utils import timezone

from django_jobguard.models import QueuedJob
from tests.support.operate import user_with, waiting

pytestmark = pytest.mark.django_db

LIVE = "/admin/django_jobguard/dashboard/live.json"
PAGES = ["dashboard", "queuedjob", "failedjob", "lock", "throttle", "worker", "pausedqueue",
         "jobresult", "scheduletick", "chain", "batch", "finishedrun"]


def test_live_json_has_the_queues_and_a_version_that_moves_with_the_counts(admin_client):
    row = waiting(queue_name="mail")
    first = admin_client.get(LIVE).json()
    assert first["queues"]["mail"]["waiting"] == 1
    assert first["queues"]["mail"]["recommended_workers"] == 1
    assert first["queues"]["mail"]["breached"] == []
    # Only the age moved: same version.
    QueuedJob.objects.filter(pk=row.pk).update(
        available_at=timezone.now() - datetime.timedelta(minutes=5))
    aged = admin_client.get(LIVE).json()
    assert aged["queues"]["mail"]["oldest_waiting_seconds"] > 200
    assert aged["version"] == first["version"]
    waiting(queue_name="mail")
    assert admin_client.get(LIVE).json()["version"] != first["version"]


def test_live_json_needs_the_queued_jobs_view_permission(client):
    client.force_login(user_with("nobody"))
    assert client.get(LIVE).status_code == 403
    client.force_login(user_with("viewer", "view_queuedjob"))
    assert client.get(LIVE).status_code == 200
    client.logout()
    assert client.get(LIVE).status_code == 302  # to the login page


@pytest.mark.parametrize("name", PAGES)
def test_every_page_has_the_live_bar_unless_it_is_turned_off(admin_client, name):
    url = f"/admin/django_jobguard/{name}/"
    page = admin_client.get(url).content.decode()
    assert 'id="jobguard-live"' in page and 'data-interval="10"' in page
    assert "django_jobguard/live.js" in page and "Pause live updates" in page
    with override_settings(JOBGUARD={"ADMIN_REFRESH_SECONDS": 0}):
        assert 'id="jobguard-live"' not in admin_client.get(url).content.decode()
