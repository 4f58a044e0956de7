"""Whatever ends a job's retries, its failed job says which limit ended it (``reason``) and
keeps the last exception the job itself raised (``last_error``, with the traceback)."""

from __future__ import annotations

import datetime

import pytest
from django.test import override_settings
from django.utils import timezone

from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob
from tests.support import failure_jobs, make_due, work

pytestmark = pytest.mark.django_db

TWILIO = "tests.support.failure_jobs.ServiceDown: Twilio: 503 Service Unavailable"


def failed_job() -> FailedJob:
    assert not QueuedJob.objects.exists()
    return FailedJob.objects.get()


def run_until_failed(limit: int = 10) -> list[str]:
    """Work the queue, making backed-off rows due, until nothing is left."""
    states: list[str] = []
    for _ in range(limit):
        states += work()
        if not QueuedJob.objects.exists():
            return states
        make_due()
    raise AssertionError(f"still queued after {limit} rounds: {states}")


def test_tries_used_up_by_exceptions_name_the_last_try_and_keep_the_error():
    failure_jobs.CallsTwilio().dispatch()
    assert run_until_failed() == ["RELEASED", "FAILED"]
    failed = failed_job()
    assert failed.exception_class == "tests.support.failure_jobs.ServiceDown"
    assert failed.reason == "its last try (2 of 2) raised"
    assert failed.last_error.startswith(TWILIO)
    assert "Traceback (most recent call last)" in failed.last_error


def test_max_exceptions_is_named_as_the_limit():
    failure_jobs.CallsTwilioMaxExceptions().dispatch()
    assert run_until_failed() == ["RELEASED", "FAILED"]
    failed = failed_job()
    assert failed.reason == "2 exceptions reached its max_exceptions of 2"
    assert failed.last_error.startswith(TWILIO)


def test_retry_deadline_passing_while_the_circuit_is_open_names_both_and_the_error(
        store_alias):
    failure_jobs.CallsTwilioUntil().dispatch()
    assert work() == ["RELEASED"]  # the circuit counted the 503 and opened
    make_due()
    assert work() == ["RELEASED"]  # deferred: the circuit is open
    row = QueuedJob.objects.get()
    assert row.wait_reason == "circuit 'twilio-api' was open"
    assert row.last_error.startswith(TWILIO)  # the middleware handled it; the error is kept
    # The deadline passes while the circuit is still open.
    deadline = timezone.now() - datetime.timedelta(seconds=1)
    QueuedJob.objects.update(payload={**row.payload, "retry_until": deadline.isoformat()})
    make_due()
    assert work() == ["FAILED"]
    failed = failed_job()
    assert failed.exception_class.endswith("MaxAttemptsExceededError")
    when = deadline.astimezone(datetime.UTC).strftime("%H:%M:%S UTC")
    assert failed.reason == f"retry deadline {when} passed while circuit 'twilio-api' was open"
    assert failed.message == (
        f"tests.support.failure_jobs.CallsTwilioUntil has been attempted too many times: retry "
        f"deadline {when} passed while circuit 'twilio-api' was open; last error: "
        f"ServiceDown: Twilio: 503 Service Unavailable.")
    assert failed.last_error.startswith(TWILIO) and "Traceback" in failed.last_error


def test_tries_used_up_by_open_circuit_deferrals_name_the_circuit(store_alias):
    with override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                     "STORE": store_alias,
                                     "DEFERRALS_CONSUME_ATTEMPTS": True}):
        failure_jobs.CallsTwilioThroughCircuit().dispatch()
        assert work() == ["RELEASED"]  # the 503 opens the circuit
        make_due()
        assert work() == ["RELEASED"]  # open: deferred, and (Laravel's way) a try used
        make_due()
        assert work() == ["FAILED"]
    failed = failed_job()
    assert failed.reason == "2 of 2 tries used while circuit 'twilio-api' was open"
    assert failed.message.endswith(
        "2 of 2 tries used while circuit 'twilio-api' was open; last error: ServiceDown: "
        "Twilio: 503 Service Unavailable.")
    assert failed.last_error.startswith(TWILIO)


def test_a_timeout_on_the_last_try_is_the_reason_and_the_last_error():
    failure_jobs.SlowSms().dispatch()
    assert work() == ["FAILED"]
    failed = failed_job()
    assert failed.exception_class.endswith("JobTimeoutError")
    assert failed.reason == "its last try (1 of 1) timed out"
    assert failed.last_error.startswith("django_jobguard.exceptions.JobTimeoutError: The job "
                                        "has timed out after 0.3 s")


def test_fail_on_timeout_is_named():
    failure_jobs.SlowSmsFailOnTimeout().dispatch()
    assert work() == ["FAILED"]
    assert failed_job().reason == "timed out after 0.3 s (fail_on_timeout)"


def test_a_row_that_cannot_be_rebuilt_says_why():
    QueuedJob.objects.create(name="gone.Removed", payload={"args": [], "kwargs": {}},
                             created_at=timezone.now() - datetime.timedelta(minutes=11))
    QueuedJob.objects.create(name="tests.support.jobs.Noop", payload={"args": [],
                                                              "retry_until": "not-a-date"})
    assert sorted(work()) == ["FAILED", "FAILED"]
    reasons = dict(FailedJob.objects.values_list("name", "reason"))
    assert reasons == {"gone.Removed": "its job is not registered in any worker that took it "
                                       "during UNKNOWN_JOB_GRACE",
                       "tests.support.jobs.Noop": "its payload could not be decoded"}


def test_admin_and_api_show_the_reason_the_last_error_and_why_a_job_waits(admin_client,
                                                                          store_alias):
    failure_jobs.CallsTwilioThroughCircuit().dispatch()
    assert work() == ["RELEASED"]
    make_due()
    assert work() == ["RELEASED"]  # deferred by the open circuit
    row = QueuedJob.objects.get()
    page = admin_client.get(f"/admin/django_jobguard/queuedjob/{row.id}/change/").content.decode()
    assert "circuit &#x27;twilio-api&#x27; was open" in page and "ServiceDown" in page
    listed = admin_client.get("/admin/django_jobguard/queuedjob/").content.decode()
    assert "(circuit &#x27;twilio-api&#x27; was open)" in listed
    api_row = admin_client.get(f"/jobguard/api/jobs/{row.id}/").json()
    assert api_row["wait_reason"] == "circuit 'twilio-api' was open"
    assert api_row["last_error"].startswith(TWILIO)
    row.delete()

    failure_jobs.CallsTwilio().dispatch()
    run_until_failed()
    failed = FailedJob.objects.get(name="tests.support.failure_jobs.CallsTwilio")
    listed = admin_client.get("/admin/django_jobguard/failedjob/").content.decode()
    assert "its last try (2 of 2) raised" in listed
    page = admin_client.get(f"/admin/django_jobguard/failedjob/{failed.id}/change/")
    assert "Traceback (most recent call last)" in page.content.decode()
    body = admin_client.get(f"/jobguard/api/failed-jobs/{failed.id}/").json()
    assert body["reason"] == "its last try (2 of 2) raised"
    assert body["last_error"].startswith(TWILIO)
