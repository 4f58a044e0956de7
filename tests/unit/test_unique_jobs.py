"""Unique jobs through dispatch and the worker, on both stores: when the lock is taken, kept
and released (laravel-semantics §5 and the §15 edge cases)."""

from __future__ import annotations

import pytest
from demo.models import Profile
from django.db import transaction

from django_jobguard import dispatch_many, signals
from django_jobguard import queue as job_queue
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.operations import inspect_locks
from django_jobguard.stores import get_store
from django_jobguard.unique_jobs import lock_key
from tests.support import expire, lock_jobs, make_due, work
from tests.support.lock_jobs import UniqueFor, UniqueProfile, UniqueProfileDrop, UniqueRecord

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _events():
    lock_jobs.EVENTS.clear()


@pytest.fixture
def store(store_alias):
    return get_store(store_alias)


def held(job) -> str | None:
    info = get_store().get_lock(lock_key(job))
    return info.owner if info else None


def test_second_dispatch_is_skipped_with_a_falsy_handle_and_a_signal(store):
    seen = []
    receiver = lambda sender, job, **kw: seen.append((sender, job.key))  # noqa: E731
    signals.job_skipped_unique.connect(receiver)
    try:
        first = UniqueRecord("a").dispatch()
        second = UniqueRecord("a").dispatch()
        other = UniqueRecord("b").dispatch()
    finally:
        signals.job_skipped_unique.disconnect(receiver)
    assert first and other
    assert not second and second.skipped == "unique" and second.id is None
    assert seen == [(UniqueRecord, "a")]
    assert QueuedJob.objects.count() == 2
    row = QueuedJob.objects.get(id=first.id)
    assert row.payload["unique"] == {
        "key": "jobguard:unique:tests.support.lock_jobs.UniqueRecord:a", "store": store.alias,
        "owner": first.id}
    assert held(UniqueRecord("a")) == first.id


def test_success_releases_the_lock(store):
    UniqueRecord("a").dispatch()
    assert work() == ["DONE"]
    assert held(UniqueRecord("a")) is None
    assert UniqueRecord("a").dispatch()


def test_retry_keeps_the_lock_and_final_failure_releases_it(store):
    first = UniqueRecord("a", outcome="raise").dispatch()
    for _ in range(2):
        assert work() == ["RELEASED"]
        assert held(UniqueRecord("a")) == first.id
        assert not UniqueRecord("a").dispatch()
        make_due()
    assert work() == ["FAILED"]
    assert held(UniqueRecord("a")) is None
    assert UniqueRecord("a").dispatch()


@pytest.mark.parametrize("outcome, states, still_held", [
    ("release", ["RELEASED"], True),   # self.release(): a retry, lock kept
    ("defer", ["RELEASED"], True),     # a deferral: lock kept
    ("fail", ["FAILED"], False),       # fail(): final, lock released
])
def test_each_outcome_keeps_or_releases_the_lock(store, outcome, states, still_held):
    handle = UniqueRecord("a", outcome=outcome).dispatch()
    assert work(max_jobs=1) == states
    assert (held(UniqueRecord("a")) == handle.id) is still_held


def test_crash_recovery_failure_releases_the_lock(store):
    handle = UniqueRecord("a").dispatch()
    # A worker took it (attempt 1 of tries=3 used each time) and died three times.
    QueuedJob.objects.update(attempts=3, reserved_at=None)
    assert work() == ["FAILED"]
    assert FailedJob.objects.get().exception_class.endswith("MaxAttemptsExceededError")
    assert held(UniqueRecord("a")) is None
    assert handle


def test_unique_for_bounds_the_lock(store):
    handle = UniqueFor("a").dispatch()
    info = store.get_lock(lock_key(UniqueFor("a")))
    assert info.owner == handle.id
    assert 2 < (info.expires_at - store.now()).total_seconds() <= 3
    assert not UniqueFor("a").dispatch()
    expire(store, info.key)  # as if 3 s passed while the worker was dead
    again = UniqueFor("a").dispatch()
    assert again
    assert store.get_lock(info.key).token > info.token


def test_old_job_finishing_never_releases_a_newer_owners_lock(store):
    old = UniqueRecord("a").dispatch()
    store.force_release(lock_key(UniqueRecord("a")))  # an operator freed it (or it expired)
    new = UniqueRecord("a").dispatch()
    assert new
    assert work(max_jobs=1) == ["DONE"]  # the old one runs first and succeeds
    assert held(UniqueRecord("a")) == new.id
    assert old.id != new.id


def test_until_processing_releases_when_handle_starts(store):
    from tests.support.lock_jobs import UntilProcessing

    first = UntilProcessing("a", outcome="raise").dispatch()
    assert not UntilProcessing("a").dispatch()  # queued: unique
    assert work(max_jobs=1) == ["RELEASED"]
    # handle() could dispatch a copy: the lock was already free; the copy owns it now.
    assert lock_jobs.EVENTS == [("until", 1, True)]
    copy_owner = held(UntilProcessing("a"))
    assert copy_owner not in (None, first.id)
    # The first job's retry starts again: it must not free the copy's lock (#59567/#60042).
    QueuedJob.objects.filter(id=first.id).update(available_at=QueuedJob.objects.get(
        id=first.id).created_at)
    row = QueuedJob.objects.get(id=first.id)
    worker_states = []
    from django_jobguard.worker import Worker, WorkerOptions

    worker = Worker(WorkerOptions(stop_when_empty=True, sleep=0),
                    log=lambda line, state: worker_states.append(state))
    (claimed,) = job_queue.claim(["default"], worker_id=worker.id, limit=1)
    assert claimed.id == row.id  # the old job, attempt 2
    worker.process(claimed)
    assert lock_jobs.EVENTS[-1] == ("until", 2, False)  # its copy was skipped: lock still held
    assert held(UntilProcessing("a")) == copy_owner


def test_until_processing_with_overlap_deferral_keeps_the_lock_until_handle(store):
    """§15.4/§15.5: a deferral before handle() keeps the lock; the released job does not
    re-acquire it; the attempt that reaches handle() releases it."""
    from tests.support.lock_jobs import UntilProcessing

    overlap_key = "jobguard:overlap:tests.support.lock_jobs.UntilProcessing:inv-1"
    assert store.acquire(overlap_key, "someone-else")
    first = UntilProcessing("a", overlap="inv-1").dispatch()
    token = store.get_lock(lock_key(UntilProcessing("a"))).token
    for _ in range(3):
        assert work(max_jobs=1) == ["RELEASED"]  # overlap: deferred
        assert not UntilProcessing("a").dispatch()  # still unique while deferred
        info = store.get_lock(lock_key(UntilProcessing("a")))
        assert (info.owner, info.token) == (first.id, token)  # same lock, never re-acquired
    assert QueuedJob.objects.get(id=first.id).attempts == 0  # deferrals used no attempt
    store.force_release(overlap_key)
    assert work(max_jobs=1) == ["DONE"]
    assert lock_jobs.EVENTS == [("until", 1, True)]  # released as handle() started


def test_until_processing_deferred_until_tries_run_out_releases_on_failure(store, settings):
    from tests.support.lock_jobs import UntilProcessing

    settings.JOBGUARD = {**settings.JOBGUARD, "DEFERRALS_CONSUME_ATTEMPTS": True}
    assert store.acquire("jobguard:overlap:tests.support.lock_jobs.UntilProcessing:inv-1", "other")
    UntilProcessing("a", overlap="inv-1").dispatch()
    assert work() == ["RELEASED"] * 3 + ["FAILED"]
    assert held(UntilProcessing("a")) is None  # it never ran, but failed for good: freed


def test_missing_model_releases_the_lock(store):
    """§15.1: the model is gone before the job runs; the lock still comes free."""
    for job_class, state in [(UniqueProfile, "FAILED"), (UniqueProfileDrop, "DELETED")]:
        profile = Profile.objects.create(name="gone")
        assert job_class(profile).dispatch()
        profile.delete()
        assert work() == [state]
        assert held(job_class(Profile(pk=1))) is None
    assert FailedJob.objects.count() == 1  # the DELETED one left no failed job


def test_missing_model_does_not_release_a_replacement_dispatchs_lock(store):
    gone, kept = Profile.objects.create(name="gone"), Profile.objects.create(name="kept")
    UniqueProfile(gone).dispatch()
    expire(store, lock_key(UniqueProfile(gone)))
    replacement = UniqueProfile(kept).dispatch()
    assert replacement
    gone.delete()
    assert work(max_jobs=1) == ["FAILED"]
    assert held(UniqueProfile(kept)) == replacement.id
    assert work() == ["DONE"]
    assert held(UniqueProfile(kept)) is None


def test_dispatch_many_with_duplicates_in_the_batch_and_against_the_queue(store):
    results = dispatch_many([UniqueRecord("1"), UniqueRecord("1"), UniqueRecord("2"),
                             UniqueRecord("1"), lock_jobs.Overlap("x")])
    assert [bool(r) for r in results] == [True, False, True, False, True]
    assert [r.skipped for r in results] == [None, "unique", None, "unique", None]
    again = dispatch_many([UniqueRecord("1"), UniqueRecord("3")])
    assert [bool(r) for r in again] == [False, True]
    assert QueuedJob.objects.count() == 4
    assert {held(UniqueRecord(k)) for k in "123"} == {results[0].id, results[2].id, again[1].id}


def test_a_failed_insert_gives_the_locks_back(store, monkeypatch):
    def broken_push(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(job_queue, "push", broken_push)
    with pytest.raises(RuntimeError, match="went away"):
        dispatch_many([UniqueRecord("1"), UniqueRecord("2")])
    monkeypatch.undo()
    assert held(UniqueRecord("1")) is None and held(UniqueRecord("2")) is None
    assert UniqueRecord("1").dispatch()


def test_an_error_midway_through_the_batch_gives_the_earlier_locks_back(store):
    class Exploding(UniqueRecord):
        name = "tests.Exploding"
        abstract = True

        def unique_id(self):
            if self.key == "bad":
                raise LookupError("no id for you")
            return self.key

    with pytest.raises(LookupError):
        dispatch_many([Exploding("1"), Exploding("bad")])
    assert held(Exploding("1")) is None
    assert not QueuedJob.objects.exists()


def test_a_rolled_back_dispatch_leaves_no_lock_that_blocks_the_next(
        store_alias, django_capture_on_commit_callbacks):
    for on_commit in (False, True):
        with pytest.raises(RuntimeError), transaction.atomic():
            assert UniqueRecord("a").dispatch(on_commit=on_commit)
            raise RuntimeError("the view failed after dispatching")
        assert not QueuedJob.objects.exists()
        if store_alias == "database" or on_commit:  # the lock went with the transaction
            assert held(UniqueRecord("a")) is None
        else:  # Redis cannot roll back: the lock stays, but its job has no row...
            (status,) = inspect_locks(get_store())
            assert status.stale and "no longer queued" in status.stale_reason
        with django_capture_on_commit_callbacks(execute=True):  # the test's transaction
            handle = UniqueRecord("a").dispatch(on_commit=on_commit)  # ...so it's taken over
        assert handle and held(UniqueRecord("a")) == handle.id
        assert not UniqueRecord("a").dispatch()  # and the new one is unique again
        assert work() == ["DONE"]
        assert held(UniqueRecord("a")) is None


def test_a_lock_whose_job_row_is_gone_is_taken_over(store):
    """A process that died after its job's row went (or a row deleted by hand) left the lock:
    the next dispatch takes it over instead of being dropped until ``unique_for``."""
    first = UniqueRecord("a").dispatch()
    QueuedJob.objects.filter(id=first.id).delete()
    second = UniqueRecord("a").dispatch()
    assert second and held(UniqueRecord("a")) == second.id


def test_a_duplicate_in_one_transaction_is_dropped_with_its_row(store):
    with transaction.atomic():
        assert UniqueRecord("a").dispatch()
        assert not UniqueRecord("a").dispatch()  # the first's row is in this transaction
    assert QueuedJob.objects.count() == 1


def test_on_commit_inside_a_transaction_checks_at_the_commit(
        store, django_capture_on_commit_callbacks):
    assert UniqueRecord("a").dispatch()
    with django_capture_on_commit_callbacks(execute=True):  # the test's transaction commits
        results = dispatch_many([UniqueRecord("a"), UniqueRecord("b")], on_commit=True)
        assert all(results)  # not known before the commit
    assert [bool(r) for r in results] == [False, True]
    assert results[0].skipped == "unique" and results[0].id is None
    assert QueuedJob.objects.count() == 2


def test_unique_via_puts_the_lock_in_another_store(store_alias):
    if store_alias != "redis":
        pytest.skip("needs the Redis store beside the database store")

    class ViaDatabase(UniqueRecord):
        name = "tests.ViaDatabase"

        def unique_via(self):
            return "database"

    handle = ViaDatabase("a").dispatch()
    key = lock_key(ViaDatabase("a"))
    assert get_store("database").get_lock(key).owner == handle.id
    assert get_store("redis").get_lock(key) is None
    assert QueuedJob.objects.get().payload["unique"]["store"] == "database"
    assert work() == ["DONE"]
    assert get_store("database").get_lock(key) is None


def test_bad_unique_settings_fail_at_dispatch_naming_the_job(store):
    class Negative(UniqueRecord):
        name = "tests.Negative"
        abstract = True
        unique_for = -5

    with pytest.raises(ValueError, match=r"tests.Negative.unique_for must be seconds >= 0"):
        Negative("a").dispatch()
    assert not QueuedJob.objects.exists()


def test_a_long_unique_id_is_shortened_to_a_key_every_store_takes(store):
    first, second = UniqueRecord("x" * 300), UniqueRecord("x" * 299 + "y")
    assert first.dispatch() and second.dispatch()  # distinct ids stay distinct
    assert not UniqueRecord("x" * 300).dispatch()  # and the same id is still unique
    assert len(lock_key(first)) <= 200 and lock_key(first) != lock_key(second)
    assert held(first) is not None


def test_dispatch_sync_bypasses_uniqueness(store):
    assert UniqueRecord("a").dispatch()
    UniqueRecord("a").dispatch_sync()  # runs here, like Laravel's dispatchSync
    assert lock_jobs.EVENTS == [("unique", "ok", 1)]
    assert held(UniqueRecord("a")) is not None  # the queued copy still owns its lock


def test_demo_save_clicked_three_times_syncs_once(store):
    from demo.jobs import SyncProfile

    profile = Profile.objects.create(name="ann")
    handles = [SyncProfile(profile.pk).dispatch() for _ in range(3)]
    assert [bool(h) for h in handles] == [True, False, False]
    assert SyncProfile(Profile.objects.create(name="bob").pk).dispatch()  # per profile
    assert work() == ["DONE", "DONE"]
    profile.refresh_from_db()
    assert profile.syncs == 1
    assert SyncProfile(profile.pk).dispatch()  # a Save after the sync queues a new one


@pytest.mark.parametrize("failures, released", [(1, True), (2, False)],
                         ids=["cut-once", "down"])
def test_a_release_that_meets_a_cut_connection_is_tried_once_more(
        store, monkeypatch, caplog, failures, released):
    from django.db import OperationalError

    from django_jobguard import unique_jobs
    from django_jobguard.envelope import UniqueRef

    handle = UniqueRecord("cut").dispatch()
    key = lock_key(UniqueRecord("cut"))
    real, calls = type(store).release, []

    def flaky(self, *args, **kwargs):
        calls.append(args)
        if len(calls) <= failures:  # as a restarted database or Redis answers it
            raise OperationalError("terminating connection due to administrator command")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(store), "release", flaky)
    ref = UniqueRef(store=store.alias, key=key, owner=str(handle.id))
    assert unique_jobs.release(ref) is released
    assert len(calls) == 2  # once more, never more
    assert (held(UniqueRecord("cut")) is None) is released
    assert ("Could not release unique lock" in caplog.text) is not released
