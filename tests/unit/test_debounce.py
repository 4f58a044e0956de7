"""Debounced jobs in one process: folding, the due time and its cap, what ends folding, and
bad input (docs/long-jobs.md#debounce). Concurrent dispatch from real processes:
tests/integration/test_long_jobs_processes.py."""

from __future__ import annotations

import datetime

import pytest
from django.db import transaction
from django.utils import timezone

from django_jobguard import Job, ShouldBeUnique, debounce, dispatch_many
from django_jobguard import queue as job_queue
from django_jobguard.models import QueuedJob
from django_jobguard.testing import drain
from tests.support.long_jobs import DebouncedRecord

pytestmark = pytest.mark.django_db(transaction=True)


def args_of(row: QueuedJob) -> list:
    return row.payload["args"]


def test_first_dispatch_waits_seconds_and_later_ones_fold_with_the_last_arguments():
    first = DebouncedRecord("k", "one").dispatch()
    assert first and not first.folded
    row = QueuedJob.objects.get()
    assert row.debounce_key == debounce.key_for(DebouncedRecord("k", "x"))
    assert row.debounce_folds == 0
    # Due 1 s after the first dispatch, at the latest 60 s after it (database clock).
    assert datetime.timedelta(0) < row.available_at - row.created_at <= datetime.timedelta(
        seconds=1.5)
    assert row.debounce_deadline - row.created_at == pytest.approx(
        datetime.timedelta(seconds=60), abs=datetime.timedelta(seconds=0.5))

    second = DebouncedRecord("k", "two").dispatch()
    third = DebouncedRecord("k", "three").dispatch()
    assert second.folded and third.folded and second.id == third.id == first.id
    row = QueuedJob.objects.get()
    assert args_of(row) == ["k", "three"]
    assert row.debounce_folds == 2
    assert debounce.describe(row).endswith("2 dispatches folded")


def test_other_keys_and_plain_jobs_are_separate():
    DebouncedRecord("a", "1").dispatch()
    DebouncedRecord("b", "1").dispatch()
    DebouncedRecord("a", "2").dispatch()
    assert sorted(QueuedJob.objects.values_list("debounce_key", "debounce_folds")) == [
        (debounce.key_for(DebouncedRecord("a", "")), 1),
        (debounce.key_for(DebouncedRecord("b", "")), 0)]


def test_folding_never_pushes_the_due_time_past_max_wait(jobguard_clock):
    first = DebouncedRecord("cap", "1").dispatch(debounce=(10, 15))
    row = QueuedJob.objects.get()
    jobguard_clock.advance(8)
    DebouncedRecord("cap", "2").dispatch(debounce=(10, 15))
    row = QueuedJob.objects.get(id=first.id)
    # now + 10 s is past the deadline (first dispatch + 15 s): the deadline it is.
    assert row.available_at == row.debounce_deadline
    jobguard_clock.advance(20)  # past the deadline and still waiting: folds, stays due
    DebouncedRecord("cap", "3").dispatch(debounce=(10, 15))
    row = QueuedJob.objects.get(id=first.id)
    assert row.available_at == row.debounce_deadline and args_of(row) == ["cap", "3"]
    assert QueuedJob.objects.waiting().filter(id=first.id).exists()


def test_a_fold_before_the_cap_moves_the_due_time_to_seconds_from_now(jobguard_clock):
    DebouncedRecord("push", "1").dispatch(debounce=(10, 100))
    before = QueuedJob.objects.get().available_at
    jobguard_clock.advance(5)
    DebouncedRecord("push", "2").dispatch(debounce=(10, 100))
    after = QueuedJob.objects.get().available_at
    assert after - before == pytest.approx(datetime.timedelta(seconds=5),
                                           abs=datetime.timedelta(seconds=0.5))


def test_a_taken_row_is_not_folded_into_and_a_retried_one_neither():
    first = DebouncedRecord("run", "1").dispatch()
    [row] = job_queue.claim(["default"], worker_id="w1") or [None]
    if row is None:  # not due yet: take it as a worker would once it is
        QueuedJob.objects.filter(id=first.id).update(available_at=QueuedJob.objects.get(
            id=first.id).created_at)
        [row] = job_queue.claim(["default"], worker_id="w1")
    second = DebouncedRecord("run", "2").dispatch()
    assert not second.folded and second.id != first.id
    # The first run goes back for a retry: it keeps its own arguments and is not folded into.
    assert job_queue.release(row, count_attempt=False)
    third = DebouncedRecord("run", "3").dispatch()
    assert third.folded and third.id == second.id
    assert args_of(QueuedJob.objects.get(id=first.id)) == ["run", "1"]
    assert args_of(QueuedJob.objects.get(id=second.id)) == ["run", "3"]


def test_the_run_gets_the_last_arguments():
    for value in ("a", "b", "c"):
        DebouncedRecord("drain", value).dispatch()
    QueuedJob.objects.update(available_at=QueuedJob.objects.get().created_at)
    from demo.models import JobRun

    drain()
    assert list(JobRun.objects.values_list("label", flat=True)) == ["c"]


def test_a_rolled_back_fold_leaves_the_waiting_job_as_it_was():
    DebouncedRecord("tx", "kept").dispatch()
    with pytest.raises(RuntimeError), transaction.atomic():
        assert DebouncedRecord("tx", "gone").dispatch().folded
        raise RuntimeError
    row = QueuedJob.objects.get()
    assert args_of(row) == ["tx", "kept"] and row.debounce_folds == 0


def test_dispatch_many_folds_each_debounced_job_and_pushes_the_others():
    from tests.support.long_jobs import Sleeper

    results = dispatch_many([DebouncedRecord("m", "1"), Sleeper("plain"),
                             DebouncedRecord("m", "2")])
    assert [bool(r) for r in results] == [True, True, True]
    assert [r.folded for r in results] == [False, False, True]
    assert results[0].id == results[2].id
    assert QueuedJob.objects.count() == 2


class UniqueDebounced(ShouldBeUnique, Job):
    debounce = (1, 2)

    def handle(self):
        pass


@pytest.mark.parametrize(("value", "problem"), [
    ((0, 5), "seconds must be more than 0"),
    ((5, 1), "max_wait (1) must be at least its seconds"),
    (5, "must be (seconds, max_wait)"),
    (("x", 5), "debounce seconds"),
])
def test_bad_debounce_values_are_refused_naming_the_problem(value, problem):
    with pytest.raises((TypeError, ValueError)) as info:
        DebouncedRecord("bad", "1").dispatch(debounce=value)
    assert problem in str(info.value)
    assert not QueuedJob.objects.exists()


def test_debounce_with_a_delay_or_on_a_unique_job_is_refused():
    with pytest.raises(ValueError, match="takes no delay"):
        DebouncedRecord("bad", "1").dispatch(delay=5)
    with pytest.raises(TypeError, match="both unique and debounced"):
        UniqueDebounced().dispatch()
    assert not QueuedJob.objects.exists()


def test_the_admin_shows_when_a_debounced_job_runs_and_how_many_dispatches_folded(
        admin_client):
    for value in ("1", "2", "3"):
        job_id = DebouncedRecord("admin", value).dispatch().id
    row = QueuedJob.objects.get()
    runs_at = timezone.localtime(row.available_at).strftime("%Y-%m-%d %H:%M:%S")
    for url in ("/admin/django_jobguard/queuedjob/",
                f"/admin/django_jobguard/queuedjob/{job_id}/change/"):
        body = admin_client.get(url).content.decode()
        assert f"debounced: runs at {runs_at}" in body
        assert "2 dispatches folded" in body


def test_a_function_job_is_debounced_per_its_debounce_key():
    from tests.support.long_jobs import debounced_note

    first = debounced_note.dispatch(7, "a")
    assert debounced_note.dispatch(7, "b").folded
    assert not debounced_note.dispatch(8, "c").folded
    assert args_of(QueuedJob.objects.get(id=first.id)) == [7, "b"]
    with pytest.raises(TypeError, match="debounce_key"):
        from django_jobguard import job

        job(debounce=(1, 2), debounce_key="user")
