"""drain(): queued jobs run in this process through the worker's pipeline."""

from __future__ import annotations

import pytest
from django.test import TestCase

from django_jobguard import signals
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.testing import DrainError, capture, drain
from tests.support.testing_jobs import (
    RAN,
    Flaky,
    Forever,
    PlaceOrder,
    SyncStock,
    UniqueReport,
    send_receipt,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


def test_drain_runs_jobs_and_the_jobs_they_dispatch():
    PlaceOrder(1, 2).dispatch()
    result = drain()
    assert RAN == [("order", (1, 2)), ("sync", 1), ("sync", 2)]
    assert (result.done, result.released, result.failed, result.total) == (3, 0, 0, 3)
    assert not QueuedJob.objects.exists()


def test_not_recursive_leaves_the_jobs_dispatched_by_jobs():
    PlaceOrder(1).dispatch()
    result = drain(recursive=False)
    assert result.done == 1 and RAN == [("order", (1,))]
    assert list(QueuedJob.objects.values_list("name", flat=True)) == [SyncStock.name]


def test_drain_one_queue():
    SyncStock(1).dispatch()
    send_receipt.dispatch(5)
    assert drain(queue="mail").done == 1
    assert RAN == [("receipt", 5, False)]
    assert drain(queue=["stock", "other"]).done == 1


def test_delayed_jobs_wait_unless_delayed_is_true():
    SyncStock(1).dispatch(delay=3600)
    assert drain().total == 0 and RAN == []
    assert drain(delayed=True).done == 1 and RAN == [("sync", 1)]


def test_retries_and_failed_jobs_go_through_the_pipeline():
    Flaky(failures=1).dispatch()   # tries=3: fails once, then succeeds
    Flaky(failures=5).dispatch()   # fails all three tries
    result = drain(delayed=True)   # the retry has backoff 0, delayed=True also covers backoff
    assert (result.done, result.released, result.failed) == (1, 3, 1)
    failed = FailedJob.objects.get()
    assert failed.name == Flaky.name and "attempt 3 fails" in failed.message


def test_unique_locks_are_taken_and_released():
    UniqueReport(7).dispatch()
    assert not UniqueReport(7).dispatch()  # the queued copy holds the lock
    assert drain().done == 1
    assert RAN == [("report", 7), ("copy queued", False)]  # still held while it runs
    assert UniqueReport(7).dispatch()  # released once it finished


def test_signals_and_middleware_run_as_in_a_worker():
    seen = []

    def on_processed(sender, job_id, **kwargs):
        seen.append(job_id)

    signals.job_processed.connect(on_processed)
    try:
        handle = SyncStock(3).dispatch()
        drain()
    finally:
        signals.job_processed.disconnect(on_processed)
    assert seen == [handle.id]


def test_a_job_that_keeps_releasing_stops_at_max_jobs():
    Forever().dispatch()
    with pytest.raises(DrainError, match="ran 5 jobs and jobs are still due"):
        drain(max_jobs=5)
    assert len(RAN) == 5
    with pytest.raises(ValueError, match="max_jobs"):
        drain(max_jobs=0)


def test_drain_fixture(jobguard_drain, jobguard_capture):
    PlaceOrder(9).dispatch()
    assert jobguard_drain().done == 2
    jobguard_capture.assert_dispatched(SyncStock, args=(9,), count=1)


class DrainInTestCase(TestCase):
    def setUp(self):
        RAN.clear()

    def test_on_commit_dispatches_of_jobs_are_run(self):
        with capture() as jobs:
            PlaceOrder(4, 5, on_commit=True).dispatch(on_commit=True)
            result = drain()
        self.assertEqual(result.done, 3)
        self.assertEqual(RAN, [("order", (4, 5)), ("sync", 4), ("sync", 5)])
        jobs.assert_dispatched(SyncStock, count=2)
