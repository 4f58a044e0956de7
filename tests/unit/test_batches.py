"""Batches: counts, then/catch/finally callbacks (each once), cancelling, failures allowed
or not, jobs added from inside, retries of failed members."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import batch, operations
from django_jobguard.models import Batch, FailedJob, QueuedJob
from tests.support import flow_jobs
from tests.support.flow_jobs import CallbackRecord, Flaky, Grow, Step
from tests.support.inprocess import work

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _failing():
    yield
    flow_jobs.FAILING.clear()


def labels() -> list[str]:
    return list(JobRun.objects.order_by("id").values_list("label", flat=True))


def callbacks() -> dict[str, str]:
    return dict(JobRun.objects.filter(label__in=["then", "catch", "finally"])
                .values_list("label", "key"))


def full(pending: batch) -> batch:
    return (pending.then(CallbackRecord("then")).catch(CallbackRecord("catch"))
            .finally_(CallbackRecord("finally")))


def test_then_and_finally_run_once_every_job_succeeded():
    row = full(batch([Step(str(i)) for i in range(5)], name="five")).dispatch()
    assert (row.total_jobs, row.pending_jobs, row.failed_jobs, row.name) == (5, 5, 0, "five")
    assert len(row.job_ids) == 5 and QueuedJob.objects.count() == 5 and row.progress == 0
    work()
    row.refresh()
    assert (row.pending_jobs, row.failed_jobs, row.processed_jobs) == (0, 0, 5)
    assert row.finished and row.progress == 1 and not row.cancelled
    assert row.status == "completed"
    assert callbacks() == {"then": "5/0/0", "finally": "5/0/0"}  # the callback sees its batch
    assert sorted(row.callbacks_queued) == ["finally", "then"]
    assert not QueuedJob.objects.exists()


def test_a_failure_cancels_the_batch_runs_catch_and_finally_and_skips_the_rest():
    flow_jobs.FAILING.add("bad")
    row = full(batch([Flaky("bad"), *[Step(str(i)) for i in range(3)]])).dispatch()
    QueuedJob.objects.filter(id=row.job_ids[0]).update(priority=10)  # it runs first
    states = work()
    row.refresh()
    assert row.cancelled and row.finished and row.status == "failed"
    assert (row.failed_jobs, row.failed_job_ids) == (1, [row.job_ids[0]])
    assert states.count("CANCELLED") == 3 and labels()[0] == "bad"  # the rest were skipped
    assert set(callbacks()) == {"catch", "finally"}
    assert row.processed_jobs == 4 and row.progress == 1


def test_allow_failures_runs_the_rest_and_a_retried_member_completes_it():
    flow_jobs.FAILING.add("bad")
    row = full(batch([Flaky("bad"), Step("a"), Step("b")])).allow_failures().dispatch()
    work()
    row.refresh()
    assert not row.cancelled and row.status == "failed"
    assert {"a", "b"} <= set(labels()) and set(callbacks()) == {"catch", "finally"}
    flow_jobs.FAILING.clear()
    operations.retry([row.job_ids[0]])
    row.refresh()
    assert (row.failed_jobs, row.failed_job_ids, row.status) == (0, [], "running")
    work()
    row.refresh()
    assert row.status == "completed" and set(callbacks()) == {"catch", "finally", "then"}
    assert JobRun.objects.filter(label="finally").count() == 1  # each callback once


def test_cancel_skips_the_jobs_not_started_and_finally_still_runs():
    row = full(batch([Step(str(i)) for i in range(4)])).dispatch()
    assert row.cancel() and not row.cancel()  # the second time: already cancelled
    row.refresh()
    assert row.status == "cancelling"
    assert work().count("CANCELLED") == 4
    row.refresh()
    assert (row.pending_jobs, row.processed_jobs) == (0, 4)
    assert row.status == "cancelled" and set(callbacks()) == {"finally"}
    assert not JobRun.objects.exclude(label="finally").exists()


def test_a_job_adds_jobs_to_its_own_batch_before_it_finishes():
    row = full(batch([Grow("g", more=3), Step("x")])).dispatch()
    work()
    row.refresh()
    assert (row.total_jobs, row.pending_jobs) == (5, 0)
    assert {"g-0", "g-1", "g-2", "x"} <= set(labels())
    assert callbacks()["then"] == "5/0/0"
    # then ran after the added jobs, not when the first two were done
    assert labels().index("then") > max(labels().index(f"g-{i}") for i in range(3))


def test_an_operator_cancelling_a_waiting_member_counts_it_as_processed():
    row = full(batch([Step("a"), Step("b")])).dispatch()
    operations.cancel(QueuedJob.objects.filter(id=row.job_ids[0]))
    work()
    row.refresh()
    assert row.pending_jobs == 0 and set(callbacks()) == {"then", "finally"}


def test_an_empty_batch_is_done_at_once():
    row = full(batch([])).dispatch()
    assert row.finished and row.total_jobs == 0
    work()
    assert set(callbacks()) == {"then", "finally"}


def test_bad_input_is_refused_at_dispatch_and_nothing_is_queued():
    with pytest.raises(TypeError, match="A batch holds jobs"):
        batch([Step("a"), "not a job"]).dispatch()
    with pytest.raises(TypeError, match=r"batch\(\)\.then\(\) takes a job"):
        batch([Step("a")]).then(print)
    with pytest.raises(TypeError, match="args"):
        batch([Step(object())]).dispatch()
    assert not Batch.objects.exists() and not QueuedJob.objects.exists()
    assert not FailedJob.objects.exists()


def test_housekeeping_settles_a_batch_a_dying_worker_left_complete():
    row = full(batch([Step("a")])).dispatch()
    # As if the worker died between the member's ack (which counted it) and the callbacks:
    QueuedJob.objects.filter(id=row.job_ids[0]).delete()
    Batch.objects.filter(id=row.id).update(pending_jobs=0)
    assert operations.housekeeping().batches == 1
    assert operations.housekeeping().batches == 0  # once
    work()
    assert set(callbacks()) == {"then", "finally"}
    assert Batch.objects.get(id=row.id).status == "completed"
