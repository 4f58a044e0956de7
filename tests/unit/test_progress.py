"""``self.progress()`` stores at most one write a second (the latest value within a second);
``self.cancelled`` reads the row at most once a second; both are visible in the API and the
admin."""

from __future__ import annotations

import datetime

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from django_jobguard import dispatch, queue
from django_jobguard.models import QueuedJob
from django_jobguard.progress import RunReporter, check_fraction
from tests.support import jobs, wait_for
from tests.support.operate import API

pytestmark = pytest.mark.django_db


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _running(job=None):
    dispatch(job or jobs.Noop(1))
    [row] = queue.claim(["default"], worker_id="w1")
    return row


def test_progress_writes_at_most_once_a_second_and_keeps_the_latest_value():
    row = _running()
    clock = FakeClock()
    reporter = RunReporter(str(row.id), worker_id="w1", using="default", clock=clock)
    reporter.progress(0.1, "page 1 of 10")
    for page in range(2, 6):  # within the same second: no write
        reporter.progress(page / 10, f"page {page} of 10")
    assert reporter.writes == 1
    stored = QueuedJob.objects.get(id=row.id)
    assert (stored.progress, stored.progress_message) == (0.1, "page 1 of 10")
    clock.now += 1.0
    reporter.flush()  # what the timer does when the second is up
    stored = QueuedJob.objects.get(id=row.id)
    assert (stored.progress, stored.progress_message) == (0.5, "page 5 of 10")
    assert reporter.writes == 2
    reporter.close()


@pytest.mark.django_db(transaction=True)  # the timer thread has its own connection
def test_the_timer_writes_the_latest_value_when_the_second_is_up():
    row = _running()
    reporter = RunReporter(str(row.id), worker_id="w1", using="default")
    reporter.progress(0.2, "a")
    reporter.progress(0.7, "b")  # throttled: the timer writes it within a second
    wait_for(lambda: reporter.writes == 2, timeout=5, what="the throttled write")
    assert QueuedJob.objects.get(id=row.id).progress_message == "b"


def test_progress_is_not_written_to_a_row_another_worker_holds():
    row = _running()
    RunReporter(str(row.id), worker_id="someone-else", using="default").progress(0.5)
    assert QueuedJob.objects.get(id=row.id).progress is None


def test_progress_of_a_run_that_lost_its_claim_is_not_written_to_a_later_claim():
    """A run cut off by a network partition resumes after its lease passed on, and the row
    may have come back to the same worker since: its late progress must not land there."""
    row = _running()
    QueuedJob.objects.filter(id=row.id).update(available_at=timezone.now()
                                               - datetime.timedelta(seconds=1))
    [again] = queue.claim(["default"], worker_id="w1")  # its lease ran out: claimed again
    assert (again.id, again.claims) == (row.id, row.claims + 1)
    RunReporter(str(row.id), worker_id="w1", using="default", claims=row.claims).progress(0.5)
    assert QueuedJob.objects.get(id=row.id).progress is None
    RunReporter(str(row.id), worker_id="w1", using="default", claims=again.claims).progress(0.6)
    assert QueuedJob.objects.get(id=row.id).progress == 0.6


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", None])
def test_bad_fractions_are_refused_with_the_value(bad):
    with pytest.raises(ValueError, match="progress must be"):
        check_fraction(bad)


def test_cancelled_reads_at_most_once_a_second_and_sticks():
    row = _running()
    clock = FakeClock()
    reporter = RunReporter(str(row.id), worker_id="w1", using="default", clock=clock)
    assert reporter.cancelled() is False
    queue.request_cancel(row.id)
    assert reporter.cancelled() is False  # not read again within the second
    clock.now += 1.0
    assert reporter.cancelled() is True
    QueuedJob.objects.filter(id=row.id).update(cancel_requested_at=None)
    clock.now += 1.0
    assert reporter.cancelled() is True  # once seen, it stays


def test_progress_outside_a_worker_is_checked_and_dropped():
    job = jobs.Cooperative("x")
    job.progress(0.5, "fine")
    with pytest.raises(ValueError):
        job.progress(2)
    assert job.cancelled is False


def test_progress_shows_in_the_api_and_the_admin(admin_user):
    row = _running()
    RunReporter(str(row.id), worker_id="w1", using="default").progress(0.4, "page 4 of 10")
    api = APIClient()
    api.force_authenticate(admin_user)
    body = api.get(f"{API}jobs/{row.id}/").json()
    assert (body["progress"], body["progress_message"]) == (0.4, "page 4 of 10")
    client = Client()
    client.force_login(admin_user)
    page = client.get(reverse("admin:django_jobguard_queuedjob_changelist")).content.decode()
    assert "40% page 4 of 10" in page
