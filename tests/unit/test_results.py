"""Job results for plain jobs with ``keep_result = True`` (django.tasks results are tested in
test_tasks_backend.py): every run's worker and every error are kept."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_jobguard import Job
from django_jobguard.models import JobResult
from django_jobguard.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db


class FailsOnceThenReturns(Job):
    keep_result = True
    tries = 3
    backoff = 0

    def __init__(self, value: int):
        self.value = value

    def handle(self):
        if self.attempts() == 1:
            raise KeyError("first try")
        return {"value": self.value}


class AlwaysFails(Job):
    keep_result = True
    tries = 2
    backoff = 0

    def handle(self):
        raise OSError("disk gone")


class NotJsonResult(Job):
    keep_result = True

    def handle(self):
        return object()


class BigResult(Job):
    keep_result = True

    def __init__(self, size: int):
        self.size = size

    def handle(self):
        return "é" * self.size


def work() -> None:
    assert Worker(WorkerOptions(queues=["default"], stop_when_empty=True, sleep=0,
                                memory=0)).run() == 0


def test_a_retried_job_keeps_both_runs_and_the_error():
    handle = FailsOnceThenReturns(7).dispatch()
    work()
    result = JobResult.objects.get(id=handle.id)
    assert result.status == "SUCCESSFUL" and result.return_value == {"value": 7}
    assert result.attempts == 2 and len(result.worker_ids) == 2
    assert [e["exception_class_path"] for e in result.errors] == ["builtins.KeyError"]
    assert result.started_at <= result.last_attempted_at <= result.finished_at


def test_a_failed_job_keeps_every_error():
    handle = AlwaysFails().dispatch()
    work()
    result = JobResult.objects.get(id=handle.id)
    assert result.status == "FAILED" and result.return_value is None
    assert len(result.errors) == 2 and "disk gone" in result.errors[-1]["traceback"]


def test_a_return_value_that_is_not_json_is_kept_as_its_repr():
    handle = NotJsonResult().dispatch()
    work()
    assert JobResult.objects.get(id=handle.id).return_value.startswith("<object object")


def test_prune_command_needs_days_when_retention_is_off():
    with override_settings(JOBGUARD={"RESULT_RETENTION_DAYS": 0}), \
            pytest.raises(CommandError, match="keep results forever"):
        call_command("jobs_prune_results", stdout=io.StringIO())
    with pytest.raises(CommandError, match="negative"):
        call_command("jobs_prune_results", "--days", "-1", stdout=io.StringIO())


def test_a_result_over_max_result_bytes_is_stored_as_a_note_and_the_job_succeeds(caplog):
    with override_settings(JOBGUARD={"MAX_RESULT_BYTES": 1000}):
        small, exact, big = BigResult(10).dispatch(), BigResult(499).dispatch(), \
            BigResult(500).dispatch()
        work()
    assert JobResult.objects.get(id=small.id).return_value == "é" * 10
    assert JobResult.objects.get(id=exact.id).return_value == "é" * 499  # 1,000 bytes: kept
    row = JobResult.objects.get(id=big.id)
    assert row.status == "SUCCESSFUL"  # the job still succeeded
    assert row.return_value == ("[result not stored: 1002 bytes of JSON, over "
                                "JOBGUARD['MAX_RESULT_BYTES'] = 1000]")
    assert f"The result of job {big.id} was not stored: 1002 bytes" in caplog.text


def test_max_result_bytes_0_keeps_any_result():
    with override_settings(JOBGUARD={"MAX_RESULT_BYTES": 0}):
        handle = BigResult(2_000_000).dispatch()
        work()
    assert len(JobResult.objects.get(id=handle.id).return_value) == 2_000_000
