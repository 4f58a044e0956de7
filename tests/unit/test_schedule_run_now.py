"""A schedule's "run now" (issue 31): one run of its job at once, from the admin and the API,
permission-checked, that leaves the exactly-once ticks as they were."""

from __future__ import annotations

import datetime

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from django_jobguard import schedules, tags
from django_jobguard.models import QueuedJob, ScheduleTick
from django_jobguard.schedules import enqueue_due, run_now
from tests.support.operate import API, assert_error, user_with

pytestmark = pytest.mark.django_db

UTC = datetime.UTC
NOOP = "tests.support.jobs.Noop"
UNIQUE = "tests.support.lock_jobs.UniqueRecord"
RUNS = "/admin/django_jobguard/scheduletick/"


def at(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


def schedule(**entry) -> override_settings:
    entry = {"job": NOOP, "cron": "*/5 * * * *", **entry}
    return override_settings(JOBGUARD={"SCHEDULE": {"s": entry}})


def test_run_now_queues_the_job_with_its_arguments_and_no_tick():
    with schedule(args=[7], queue="reports"):
        result = run_now("s", actor="ann")
    row = QueuedJob.objects.get(id=result.id)
    assert (row.name, row.queue, row.payload["args"]) == (NOOP, "reports", [7])
    assert tags.decode(row.tags) == ["run-now", "schedule:s"]
    assert not ScheduleTick.objects.exists()


def test_the_next_regular_tick_still_happens_exactly_once():
    with schedule():
        assert enqueue_due(now=at(2026, 5, 1, 10, 0, 20)) == 1  # tick 10:00
        run_now("s")  # between two ticks
        assert enqueue_due(now=at(2026, 5, 1, 10, 4, 0)) == 0  # nothing due: no tick moved
        run_now("s")
        assert enqueue_due(now=at(2026, 5, 1, 10, 5, 1)) == 1  # tick 10:05, once
        assert enqueue_due(now=at(2026, 5, 1, 10, 5, 30)) == 0
        assert enqueue_due(now=at(2026, 5, 1, 10, 9, 59)) == 0
        assert enqueue_due(now=at(2026, 5, 1, 10, 10, 0)) == 1  # and the one after
    assert list(ScheduleTick.objects.order_by("tick").values_list("tick", flat=True)) == [
        at(2026, 5, 1, 10, 0), at(2026, 5, 1, 10, 5), at(2026, 5, 1, 10, 10)]
    by_tick = set(ScheduleTick.objects.values_list("job_id", flat=True))
    manual = {str(i) for i in QueuedJob.objects.filter(tags__contains=",run-now,")
              .values_list("id", flat=True)}
    assert len(by_tick) == 3 and len(manual) == 2
    assert QueuedJob.objects.count() == 5 and not by_tick & manual


def test_run_now_after_a_gap_does_not_hide_missed_ticks():
    with schedule(catch_up="all"):
        assert enqueue_due(now=at(2026, 5, 1, 10, 0, 20)) == 1
        run_now("s")  # the workers were down from 10:01 to 10:16
        assert enqueue_due(now=at(2026, 5, 1, 10, 16, 0)) == 3  # 10:05, 10:10, 10:15


def test_run_now_of_a_unique_job_with_a_copy_queued_is_skipped():
    with schedule(job=UNIQUE, args=["k"]):
        assert run_now("s")
        skipped = run_now("s")
    assert not skipped and skipped.skipped == "unique"
    assert QueuedJob.objects.count() == 1


def test_run_now_names_a_schedule_that_is_not_there():
    with schedule(), pytest.raises(schedules.UnknownScheduleError, match="No schedule 'nope'"):
        run_now("nope")
    with schedule(job="no.such.Job"), pytest.raises(schedules.ScheduleError):
        run_now("s")


def test_admin_run_now_button_needs_its_permission():
    viewer = Client()
    viewer.force_login(user_with("viewer", "view_scheduletick"))
    runner = Client()
    runner.force_login(user_with("runner", "view_scheduletick", "run_schedule"))
    with schedule():
        assert "Run now" not in viewer.get(RUNS).content.decode()
        assert viewer.post(f"{RUNS}run-now/s/").status_code == 403
        page = runner.get(RUNS).content.decode()
        assert "Run now" in page and f"{RUNS}run-now/s/" in page
        assert runner.get(f"{RUNS}run-now/s/").status_code == 405
        done = runner.post(f"{RUNS}run-now/s/", follow=True)
        assert "queued now; its next tick runs as planned" in done.content.decode()
        missing = runner.post(f"{RUNS}run-now/nope/", follow=True)
        assert "No schedule" in missing.content.decode()
    assert QueuedJob.objects.count() == 1 and not ScheduleTick.objects.exists()


def test_api_run_now():
    client = APIClient()
    client.force_authenticate(user_with("viewer", "view_scheduletick"))
    with schedule(args=[3]):
        assert_error(client.post(API + "schedules/s/run/"), 403, "permission_denied")
        client.force_authenticate(user_with("runner", "run_schedule"))
        created = client.post(API + "schedules/s/run/")
        assert created.status_code == 201, created.content
        body = created.json()
        assert (body["job"], body["queue"], body["schedule"]) == (NOOP, "default", "s")
        assert QueuedJob.objects.get(id=body["id"]).payload["args"] == [3]
        assert_error(client.post(API + "schedules/nope/run/"), 404)
    with schedule(job=UNIQUE, args=["k"]):
        assert client.post(API + "schedules/s/run/").status_code == 201
        assert client.post(API + "schedules/s/run/").json() == {"skipped": "unique",
                                                                 "job": UNIQUE}
