"""capture(), assert_dispatched(), assert_not_dispatched(), dispatched(), CaptureMixin."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import TestCase

from django_jobguard.models import QueuedJob
from django_jobguard.testing import (
    CaptureMixin,
    assert_dispatched,
    assert_not_dispatched,
    capture,
    dispatched,
)
from tests.support.testing_jobs import PlaceOrder, SyncStock, UniqueReport, send_receipt


@pytest.mark.django_db
def test_capture_records_args_queue_and_options():
    with capture() as jobs:
        SyncStock(42).dispatch()
        SyncStock(7).dispatch(delay=30, priority=5)
        send_receipt.dispatch(42, copy=True)
    (first, second) = jobs.assert_dispatched(SyncStock, queue="stock", count=2)
    assert (first.args, first.queue, first.delay) == ((42,), "stock", None)
    assert (second.args, second.priority, second.delay) == ((7,), 5, 30)
    assert jobs.assert_dispatched(send_receipt, args=(42,), kwargs={"copy": True}, count=1)
    jobs.assert_dispatched(SyncStock, args=(42,), queue="stock", count=1)
    jobs.assert_not_dispatched(SyncStock, args=(43,))
    # The jobs are still queued (drain() can run them).
    assert QueuedJob.objects.filter(id__in=[j.id for j in jobs]).count() == 3


@pytest.mark.django_db
def test_module_functions_use_the_innermost_capture():
    with capture() as outer:
        SyncStock(1).dispatch()
        with capture() as inner:
            SyncStock(2).dispatch()
            assert [j.args for j in dispatched(SyncStock)] == [(2,)]
            assert_dispatched(SyncStock, args=(2,), count=1)
            assert_not_dispatched(SyncStock, args=(1,))
    assert [j.args for j in outer.dispatched(SyncStock)] == [(1,), (2,)]
    assert len(inner) == 1


@pytest.mark.django_db
def test_failing_assertion_lists_what_was_dispatched():
    with capture() as jobs:
        SyncStock(41).dispatch()
        send_receipt.dispatch(9)
    with pytest.raises(AssertionError) as caught:
        jobs.assert_dispatched(SyncStock, args=(42,), queue="stock", count=1)
    message = str(caught.value)
    assert "Expected tests.support.testing_jobs.SyncStock with args=(42,), queue='stock'" in message
    assert "dispatched 0 time(s)" in message
    assert "tests.support.testing_jobs.SyncStock(41) queue='stock'" in message
    assert "tests.support.testing_jobs.send_receipt(9) queue='mail'" in message
    with pytest.raises(AssertionError,
                       match=r"(?s)not to be dispatched.*Dispatched \(2\):.*SyncStock\(41\)"):
        jobs.assert_not_dispatched(SyncStock)
    with pytest.raises(AssertionError, match="dispatched 1 time"):
        jobs.assert_dispatched(SyncStock, count=2)


@pytest.mark.django_db
def test_nothing_dispatched_says_so():
    with capture() as jobs:
        pass
    with pytest.raises(AssertionError, match="Nothing was dispatched"):
        jobs.assert_dispatched(SyncStock)


def test_a_class_that_is_not_a_job_is_a_clear_type_error():
    class NotAJob:
        pass

    with capture() as jobs:
        with pytest.raises(TypeError, match=r"assert_dispatched\(\) takes a Job subclass or an "
                                            r"@job function, not .*NotAJob"):
            jobs.assert_dispatched(NotAJob)
        with pytest.raises(TypeError, match="assert_not_dispatched"):
            assert_not_dispatched(print)
        with pytest.raises(TypeError, match="not SyncStock"):
            assert_dispatched(SyncStock(1))  # an instance, not the class


def test_assertions_need_an_active_capture():
    with pytest.raises(RuntimeError, match="needs an active capture"):
        assert_dispatched(SyncStock)


@pytest.mark.django_db
def test_unique_copies_not_queued_are_not_dispatched():
    with capture() as jobs:
        assert UniqueReport(5).dispatch()
        assert not UniqueReport(5).dispatch()
    jobs.assert_dispatched(UniqueReport, args=(5,), count=1)
    assert [j.report_id for j in jobs.skipped] == [5]


@pytest.mark.django_db
def test_on_commit_dispatch_is_recorded_once_the_code_leaves_its_transaction():
    # pytest-django's db fixture runs the test in a transaction that never commits.
    with capture() as jobs:
        with transaction.atomic():
            SyncStock(3).dispatch(on_commit=True)
            assert jobs.dispatched() == []  # still inside the code's own transaction
        jobs.assert_dispatched(SyncStock, args=(3,), count=1)
    assert QueuedJob.objects.filter(name=SyncStock.name).count() == 1


class CaptureMixinTests(CaptureMixin, TestCase):
    def test_on_commit_dispatch_in_test_case(self):
        SyncStock(42).dispatch(on_commit=True)
        self.assertDispatched(SyncStock, args=(42,), queue="stock", count=1)
        self.assertNotDispatched(PlaceOrder)
        self.assertEqual([j.args for j in self.dispatched()], [(42,)])

    def test_each_test_has_its_own_capture(self):
        self.assertEqual(self.dispatched(), [])
        with self.assertRaises(TypeError):
            self.assertDispatched(object)


@pytest.mark.django_db
def test_jobguard_capture_fixture(jobguard_capture):
    PlaceOrder(1, 2).dispatch()
    jobguard_capture.assert_dispatched(PlaceOrder, args=(1, 2), count=1)
    assert_dispatched(PlaceOrder)  # the fixture's capture is the active one
