"""Periodic schedules: settings and @periodic, exactly-once ticks, catch_up, DST, checks,
``jobs_schedule``."""

from __future__ import annotations

import datetime
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_jobguard import Job, periodic
from django_jobguard.checks import check_schedules
from django_jobguard.models import QueuedJob, ScheduleTick
from django_jobguard.schedules import (
    Schedule,
    ScheduleError,
    all_schedules,
    enqueue_due,
    forget_declared,
    schedule_status,
)
from tests.support.inprocess import work

pytestmark = pytest.mark.django_db

UTC = datetime.UTC
NOOP = "tests.support.jobs.Noop"
UNIQUE = "tests.support.lock_jobs.UniqueRecord"


def at(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


def schedule(**entry) -> override_settings:
    entry = {"job": NOOP, "cron": "*/5 * * * *", **entry}
    return override_settings(JOBGUARD={"SCHEDULE": {"s": entry}})


def ticks(name: str = "s") -> list[datetime.datetime]:
    return list(ScheduleTick.objects.filter(schedule=name).order_by("tick")
                .values_list("tick", flat=True))


def test_a_due_tick_is_enqueued_once_however_often_asked():
    with schedule(args=[7]):
        assert enqueue_due(now=at(2026, 5, 1, 10, 0, 20)) == 1
        assert enqueue_due(now=at(2026, 5, 1, 10, 0, 40)) == 0
        assert enqueue_due(now=at(2026, 5, 1, 10, 4, 59)) == 0
        assert enqueue_due(now=at(2026, 5, 1, 10, 5, 1)) == 1
    assert ticks() == [at(2026, 5, 1, 10, 0), at(2026, 5, 1, 10, 5)]
    rows = list(QueuedJob.objects.order_by("created_at"))
    assert [r.name for r in rows] == [NOOP, NOOP]
    assert rows[0].payload["args"] == [7]
    assert set(ScheduleTick.objects.values_list("job_id", flat=True)) == {str(r.id) for r in rows}
    assert work() == ["DONE", "DONE"]


def test_a_new_schedule_does_not_backfill_from_the_past():
    with schedule(cron="0 3 * * *", catch_up="all"):
        assert enqueue_due(now=at(2026, 5, 1, 12, 0)) == 0  # 03:00 was hours ago
        assert enqueue_due(now=at(2026, 5, 2, 3, 0, 30)) == 1
    assert ticks() == [at(2026, 5, 2, 3, 0)]


@pytest.mark.parametrize("catch_up, expected, skipped", [
    ("all", [at(2026, 5, 1, 10, m) for m in (0, 5, 10, 15, 20, 25, 30)], ""),
    ("last", [at(2026, 5, 1, 10, 0), at(2026, 5, 1, 10, 30)], ""),
    ("none", [at(2026, 5, 1, 10, 0), at(2026, 5, 1, 10, 30)], "missed"),
])
def test_catch_up_after_no_worker_ran(catch_up, expected, skipped):
    with schedule(catch_up=catch_up):
        enqueue_due(now=at(2026, 5, 1, 10, 0, 10))
        enqueue_due(now=at(2026, 5, 1, 10, 32))  # workers were down from 10:00 to 10:32
    assert ticks() == expected
    newest = ScheduleTick.objects.get(tick=expected[-1])
    assert newest.skipped == skipped
    assert QueuedJob.objects.count() == (1 if skipped else len(expected))


def test_catch_up_none_still_runs_a_tick_that_is_just_due():
    with schedule(catch_up="none"):
        enqueue_due(now=at(2026, 5, 1, 10, 0, 10))
        enqueue_due(now=at(2026, 5, 1, 10, 5, 10))
    assert QueuedJob.objects.count() == 2


def test_spring_forward_0230_runs_once():
    with schedule(cron="30 2 * * *", timezone="Europe/Berlin"):
        enqueue_due(now=at(2026, 3, 28, 1, 30, 5))  # 02:30 CET on the night before
        now = at(2026, 3, 28, 23, 0)
        while now < at(2026, 3, 29, 6, 0):  # a worker beating every 15 s all night
            enqueue_due(now=now)
            now += datetime.timedelta(seconds=15)
    # 2026-03-29 02:30 does not exist in Berlin: it runs once, at 03:00 CEST (01:00 UTC).
    assert ticks() == [at(2026, 3, 28, 1, 30), at(2026, 3, 29, 1, 0)]
    assert QueuedJob.objects.count() == 2


def test_fall_back_0230_runs_once():
    with schedule(cron="30 2 * * *", timezone="Europe/Berlin"):
        enqueue_due(now=at(2026, 10, 24, 0, 30, 5))
        now = at(2026, 10, 24, 22, 0)
        while now < at(2026, 10, 25, 6, 0):  # 02:30 happens twice this night
            enqueue_due(now=now)
            now += datetime.timedelta(seconds=15)
    assert ticks() == [at(2026, 10, 24, 0, 30), at(2026, 10, 25, 0, 30)]
    assert QueuedJob.objects.count() == 2


def test_a_unique_periodic_job_is_not_queued_twice_while_one_waits():
    with schedule(job=UNIQUE, kwargs={"key": "nightly"}):
        enqueue_due(now=at(2026, 5, 1, 10, 0, 10))
        enqueue_due(now=at(2026, 5, 1, 10, 5, 10))  # the 10:00 copy has not run yet
    rows = list(ScheduleTick.objects.order_by("tick"))
    assert [r.skipped for r in rows] == ["", "unique"]
    assert rows[1].job_id == "" and QueuedJob.objects.count() == 1


def test_periodic_decorator_declares_a_schedule(scratch_jobs):
    @periodic("@hourly", name="hourly-report", args=[3])
    class HourlyReport(Job):
        def __init__(self, n):
            self.n = n

        def handle(self):
            return self.n

    try:
        found = all_schedules()["hourly-report"]
        assert found.job == HourlyReport.name and found.cron.text == "@hourly"
        assert enqueue_due(now=at(2026, 5, 1, 11, 0, 1)) == 1
        assert QueuedJob.objects.get().name == HourlyReport.name
    finally:
        forget_declared("hourly-report")


def test_periodic_on_a_function_job(scratch_jobs):
    from django_jobguard import job

    target = periodic("*/5 * * * *", name="fn-schedule")(job(name="tests.fn_sched")(_f))
    try:
        assert all_schedules()["fn-schedule"].job == "tests.fn_sched"
        assert target.name == "tests.fn_sched"
    finally:
        forget_declared("fn-schedule")


def _f():
    return 1


def test_periodic_refuses_a_plain_function():
    with pytest.raises(TypeError, match="above @job"):
        periodic("* * * * *")(_f)


def test_a_broken_schedule_is_logged_and_the_others_run(caplog, scratch_jobs):
    with override_settings(JOBGUARD={"SCHEDULE": {
            "gone": {"job": "nowhere.Gone", "cron": "* * * * *"},
            "ok": {"job": NOOP, "cron": "* * * * *"}}}):
        assert enqueue_due(now=at(2026, 5, 1, 10, 0, 5)) == 1
    assert ticks("ok") == [at(2026, 5, 1, 10, 0)] and ticks("gone") == []
    assert "nowhere.Gone" in caplog.text


@pytest.mark.parametrize("entry, check_id, text", [
    ({"job": NOOP, "cron": "61 * * * *"}, "jobguard.E060", "minute: 61 is outside 0-59"),
    ({"job": "nope.Missing", "cron": "* * * * *"}, "jobguard.E061", "'nope.Missing'"),
    ({"job": NOOP, "cron": "* * * * *", "timezone": "Nowhere/City"}, "jobguard.E062",
     "unknown time zone"),
    ({"job": NOOP, "cron": "* * * * *", "catch_up": "some"}, "jobguard.E063", "catch_up"),
    ({"job": NOOP}, "jobguard.E064", "at least 'job' and 'cron'"),
    ({"job": NOOP, "cron": "* * * * *", "args": [object()]}, "jobguard.E064", "JSON"),
    ({"job": NOOP, "cron": "* * * * *", "every": 5}, "jobguard.E064", "unknown key"),
])
def test_checks_report_bad_schedules(entry, check_id, text):
    with override_settings(JOBGUARD={"SCHEDULE": {"bad": entry}}):
        errors = check_schedules()
    assert [e.id for e in errors] == [check_id]
    assert "schedule 'bad'" in errors[0].msg and text in errors[0].msg


def test_checks_pass_for_good_schedules_and_warn_on_a_clash(scratch_jobs):
    with schedule():
        assert check_schedules() == []

    @periodic("* * * * *", name="s")
    class Clash(Job):
        def handle(self):
            pass

    try:
        with schedule():
            assert [e.id for e in check_schedules()] == ["jobguard.W050"]
    finally:
        forget_declared("s")


def test_build_names_the_problem():
    with pytest.raises(ScheduleError, match="bad cron expression"):
        Schedule.build("x", job=NOOP, cron="nope")


def test_status_and_jobs_schedule_command():
    with schedule(cron="0 * * * *", timezone="Europe/Berlin"):
        enqueue_due(now=at(2026, 5, 1, 10, 0, 5))
        [status] = schedule_status()
        assert status.last_tick == at(2026, 5, 1, 10, 0) and status.last_job_id
        assert status.next_tick is not None and status.next_tick.minute == 0
        out = StringIO()
        call_command("jobs_schedule", "--json", stdout=out, stderr=StringIO())
        [row] = json.loads(out.getvalue())
        assert row["name"] == "s" and row["last_tick"] == "2026-05-01T10:00:00+00:00"
        out = StringIO()
        call_command("jobs_schedule", stdout=out, stderr=StringIO())
        assert "0 * * * *" in out.getvalue() and "Europe/Berlin" in out.getvalue()


def test_jobs_schedule_without_schedules():
    out = StringIO()
    call_command("jobs_schedule", stdout=out, stderr=StringIO())
    assert "No schedules" in out.getvalue()


# -- admin and API -------------------------------------------------------------------------

def test_api_lists_schedules_with_last_and_next_run(admin_user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(admin_user)
    with schedule(cron="@daily"):
        enqueue_due(now=at(2026, 5, 1, 0, 0, 5))
        response = client.get("/jobguard/api/schedules/")
    assert response.status_code == 200, response.content
    [row] = response.json()
    assert row["name"] == "s" and row["cron"] == "@daily" and row["job"] == NOOP
    assert row["last_tick"].startswith("2026-05-01T00:00:00") and row["next_tick"]


def test_api_schedules_needs_the_view_permission():
    from rest_framework.test import APIClient

    from tests.support.operate import user_with

    client = APIClient()
    with override_settings(JOBGUARD={"API_PERMISSION_CLASSES": [
            "django_jobguard.api.permissions.JobGuardModelPermissions"]}):
        client.force_authenticate(user_with("nobody"))
        assert client.get("/jobguard/api/schedules/").status_code == 403
        client.force_authenticate(user_with("viewer", "view_scheduletick"))
        assert client.get("/jobguard/api/schedules/").status_code == 200


def test_admin_shows_schedules_and_runs(admin_client):
    with schedule(cron="0 3 * * *", timezone="Europe/Berlin"):
        enqueue_due(now=at(2026, 5, 1, 1, 0, 5))
        page = admin_client.get("/admin/django_jobguard/scheduletick/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Europe/Berlin" in html and "0 3 * * *" in html and "2026-05-01 01:00" in html
    row = ScheduleTick.objects.get()
    detail = admin_client.get(f"/admin/django_jobguard/scheduletick/{row.pk}/change/")
    assert detail.status_code == 200
    assert admin_client.get("/admin/django_jobguard/scheduletick/add/").status_code == 403


def test_a_tick_recorded_far_in_the_future_is_dropped_and_the_schedule_keeps_firing(caplog):
    ScheduleTick.objects.create(schedule="s", tick=at(2026, 5, 1, 9, 55))
    ScheduleTick.objects.create(schedule="s", tick=at(9999, 1, 1, 0, 0))  # a corrupt row
    with schedule(catch_up="all"):
        assert enqueue_due(now=at(2026, 5, 1, 10, 5, 10)) == 2
        assert enqueue_due(now=at(2026, 5, 1, 10, 10, 10)) == 1
    # catch-up went on from the newest sound tick, 09:55
    assert ticks() == [at(2026, 5, 1, 9, 55), at(2026, 5, 1, 10, 0), at(2026, 5, 1, 10, 5),
                       at(2026, 5, 1, 10, 10)]
    assert "after its next fire" in caplog.text and "9999-01-01" in caplog.text
    assert QueuedJob.objects.count() == 3


def test_a_tick_just_ahead_of_a_clock_that_stepped_back_is_kept():
    with schedule():
        assert enqueue_due(now=at(2026, 5, 1, 10, 5, 1)) == 1
        assert enqueue_due(now=at(2026, 5, 1, 10, 4, 58)) == 0  # before the recorded tick
        assert enqueue_due(now=at(2026, 5, 1, 10, 10, 1)) == 1
    assert ticks() == [at(2026, 5, 1, 10, 5), at(2026, 5, 1, 10, 10)]


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 12 31 4,6,9,11 *"])
def test_checks_warn_about_a_cron_that_never_fires(cron):
    with schedule(cron=cron):
        warnings = check_schedules()
    assert [w.id for w in warnings] == ["jobguard.W051"]
    assert "schedule 's'" in warnings[0].msg and "never fires" in warnings[0].msg
    with schedule(cron=cron, enabled=False):
        assert check_schedules() == []
