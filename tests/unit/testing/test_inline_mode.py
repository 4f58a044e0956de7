"""Inline mode: JOBGUARD["TEST_MODE"] = "inline" runs each dispatch at once."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from django_jobguard.checks import check_settings
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.testing import capture, drain, inline
from tests.support.testing_jobs import RAN, Flaky, PlaceOrder, SyncStock, UniqueReport


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


@pytest.mark.django_db
@override_settings(JOBGUARD={"TEST_MODE": "inline"})
def test_setting_runs_a_dispatch_before_it_returns():
    handle = SyncStock(42).dispatch(delay=600)  # the delay is not waited for
    assert handle and RAN == [("sync", 42)]
    assert not QueuedJob.objects.exists()


@pytest.mark.django_db
def test_jobs_dispatched_by_an_inline_job_run_after_it(jobguard_inline):
    with capture() as jobs:
        PlaceOrder(1, 2).dispatch()
    assert RAN == [("order", (1, 2)), ("sync", 1), ("sync", 2)]
    jobs.assert_dispatched(SyncStock, count=2)


@pytest.mark.django_db
def test_failures_follow_the_pipeline_not_the_caller():
    with inline():
        Flaky(failures=5).dispatch()  # attempt 1 fails: released for its retry, not raised
    assert RAN == [("flaky", 1)] and QueuedJob.objects.get().attempts == 1
    assert drain(delayed=True).failed == 1  # the retries, run by drain
    assert FailedJob.objects.count() == 1


@pytest.mark.django_db
def test_uniqueness_lasts_only_while_the_job_runs():
    with inline():
        assert UniqueReport(3).dispatch()
        assert UniqueReport(3).dispatch()  # the first one already finished and let go
    assert RAN == [("report", 3), ("copy queued", False)] * 2


@pytest.mark.django_db
def test_on_commit_dispatch_runs_after_the_commit(jobguard_inline):
    with transaction.atomic():
        SyncStock(8).dispatch(on_commit=True)
        assert RAN == []
    drain()  # the test case's transaction never commits: drain runs the callbacks
    assert RAN == [("sync", 8)]


def test_bad_test_mode_is_a_system_check_error():
    with override_settings(JOBGUARD={"TEST_MODE": "eager"}):
        errors = check_settings()
    assert [e.id for e in errors] == ["jobguard.E070"]
    assert "'eager'" in errors[0].msg
    with override_settings(JOBGUARD={"TEST_MODE": 1}):
        assert [e.id for e in check_settings()] == ["jobguard.E002"]
    with override_settings(JOBGUARD={"TEST_MODE": "inline"}):
        assert check_settings() == []
