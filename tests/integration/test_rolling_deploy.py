"""A rolling deploy: a worker on the older code takes a job of a type it does not know. It puts
the job back (without using an attempt) for UNKNOWN_JOB_GRACE, a newer worker runs it; past
the grace the job is failed with a message naming both causes (issue 12, item 5). The same
holds for a job whose constructor changed: a worker running the version before the deploy
cannot rebuild a row queued by the new one, and waits for a worker that can (issue 30,
item 2)."""

from __future__ import annotations

import datetime

import pytest
from demo.models import JobRun
from django.utils import timezone

from django_jobguard.models import FailedJob, QueuedJob
from tests.support import make_due, start_workers, worker_env
from tests.support.deploy_jobs import MODULE, SendReceipt, ShippedInTheNewRelease

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OLD = ("--stop-when-empty", "--sleep", "0.1")
#: The release before deploy_jobs (never imported here: both register tests.deploy.SendReceipt).
OLD_RELEASE = "tests.support.deploy_jobs_old"


def test_an_old_worker_puts_an_unknown_job_back_and_a_new_worker_runs_it():
    handle = ShippedInTheNewRelease("deployed").dispatch()

    out = start_workers(1, *OLD).wait(60)[0]  # the older code: no tests.support.deploy_jobs
    assert "RELEASED" in out and "unknown job" in out, out
    row = QueuedJob.objects.get(id=handle.id)
    assert row.attempts == 0 and not row.reserved_by  # put back, no attempt used
    assert "not registered in worker" in row.wait_reason
    assert not FailedJob.objects.exists() and not JobRun.objects.exists()

    make_due()
    new = worker_env(JOBGUARD_EXTRA_JOB_MODULES=MODULE)
    out = start_workers(1, *OLD, env=new).wait(60)[0]
    assert "DONE" in out, out
    assert list(JobRun.objects.values_list("job_id", "attempt")) == [(handle.id, 1)]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_past_the_grace_the_job_fails_naming_both_causes():
    handle = ShippedInTheNewRelease("too-late").dispatch()
    QueuedJob.objects.filter(id=handle.id).update(
        created_at=timezone.now() - datetime.timedelta(minutes=11))  # default grace: 10 min

    out = start_workers(1, *OLD).wait(60)[0]
    assert "FAILED" in out, out
    failed = FailedJob.objects.get(id=handle.id)
    assert failed.exception_class == "django_jobguard.registry.UnknownJobError"
    assert "No job is registered as 'tests.deploy.ShippedInTheNewRelease'" in failed.message
    assert "not deployed to the workers yet" in failed.message  # cause 1: a rolling deploy
    assert "not registered" in failed.message and "JOB_MODULES" in failed.message  # cause 2
    assert "UNKNOWN_JOB_GRACE" in failed.reason
    assert not QueuedJob.objects.exists()


def test_an_old_worker_leaves_a_job_with_a_new_argument_to_a_new_worker():
    handle = SendReceipt(7, force=True).dispatch()  # the new release's version
    old = worker_env(JOBGUARD_EXTRA_JOB_MODULES=OLD_RELEASE)
    new = worker_env(JOBGUARD_EXTRA_JOB_MODULES=MODULE)

    out = start_workers(1, *OLD, env=old).wait(60)[0]
    assert "RELEASED" in out and "incompatible job" in out, out
    assert "Traceback" not in out, out
    row = QueuedJob.objects.get(id=handle.id)
    assert row.attempts == 0 and not row.reserved_by  # put back, no attempt used
    assert "cannot rebuild it" in row.wait_reason
    assert "unexpected keyword argument 'force'" in row.wait_reason, row.wait_reason
    assert not FailedJob.objects.exists() and not JobRun.objects.exists()

    make_due()
    out = start_workers(1, *OLD, env=new).wait(60)[0]
    assert "DONE" in out, out
    assert list(JobRun.objects.values_list("label", "attempt")) == [("new:7:True", 1)]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_past_the_grace_a_job_no_worker_could_rebuild_fails_saying_why():
    handle = SendReceipt(8, force=True).dispatch()
    QueuedJob.objects.filter(id=handle.id).update(
        created_at=timezone.now() - datetime.timedelta(minutes=11))

    old = worker_env(JOBGUARD_EXTRA_JOB_MODULES=OLD_RELEASE)
    out = start_workers(1, *OLD, env=old).wait(60)[0]
    assert "FAILED" in out, out
    failed = FailedJob.objects.get(id=handle.id)
    assert failed.exception_class == "django_jobguard.registry.IncompatibleJobError"
    assert "unexpected keyword argument 'force'" in failed.message
    assert "takes (order)" in failed.message
    assert "another version of tests.deploy.SendReceipt" in failed.message
    assert "UNKNOWN_JOB_GRACE" in failed.reason
