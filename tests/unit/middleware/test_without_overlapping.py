"""WithoutOverlapping in-process on both stores: keys, deferral without attempts, dropping,
release on return/raise/timeout, owner checks, fencing tokens, renewal; the decorators for
function jobs; the jobguard.W002 check."""

from __future__ import annotations

import datetime
import enum
import threading
import uuid

import pytest
from demo.models import JobRun
from django.utils import timezone

from django_jobguard import WithoutOverlapping, job, registry, without_overlapping
from django_jobguard.checks import check_overlap_expiry, has_unbounded_overlap
from django_jobguard.context import JobContext
from django_jobguard.durations import NOW
from django_jobguard.middleware.chain import run_middleware
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.outcome import Outcome
from django_jobguard.stores import get_store
from django_jobguard.unique_jobs import ShouldBeUnique, ShouldBeUniqueUntilProcessing, lock_key
from tests.support import lock_jobs, make_due, work
from tests.support.lock_jobs import OtherOverlap, Overlap, UniqueOverlap

pytestmark = pytest.mark.django_db

KEY = "jobguard:overlap:tests.support.lock_jobs.Overlap:k"


@pytest.fixture(autouse=True)
def _events():
    lock_jobs.EVENTS.clear()


@pytest.fixture
def store(store_alias):
    return get_store(store_alias)


class Color(enum.Enum):
    RED = "red"


def test_lock_keys():
    job = Overlap("k")
    assert WithoutOverlapping("k").lock_key(job) == KEY
    assert WithoutOverlapping("k", shared=True).lock_key(job) == "jobguard:overlap:k"
    assert WithoutOverlapping(7).lock_key(job).endswith(".Overlap:7")
    assert WithoutOverlapping(Color.RED).lock_key(job).endswith(".Overlap:red")
    some = uuid.uuid4()
    assert WithoutOverlapping(some).lock_key(job).endswith(f".Overlap:{some}")
    assert WithoutOverlapping().lock_key(job) == "jobguard:overlap:tests.support.lock_jobs.Overlap:"


@pytest.mark.parametrize("kwargs, error, message", [
    ({"key": object()}, TypeError, "key must be a string, an int or a UUID"),
    ({"key": None}, TypeError, "key must be"),
    ({"key": "k", "release_after": -1}, ValueError, r"release_after=...\) must be seconds"),
    ({"key": "k", "expire_after": "10"}, ValueError, r"expire_after=...\) must be seconds"),
    ({"key": "k", "renew": True}, ValueError, "renew=True\\) needs expire_after > 0"),
])
def test_bad_options_are_rejected(kwargs, error, message):
    with pytest.raises(error, match=message):
        WithoutOverlapping(**kwargs)


def test_runs_with_a_fencing_token_and_releases(store):
    Overlap("k").dispatch()
    Overlap("k").dispatch()
    assert work() == ["DONE", "DONE"]
    runs = list(JobRun.objects.filter(label="overlap").order_by("started_at"))
    assert len(runs) == 2 and runs[0].token < runs[1].token
    assert store.get_lock(KEY) is None


def test_held_lock_defers_without_using_an_attempt(store):
    assert store.acquire(KEY, "someone-else")
    handle = Overlap("k", release_after=0).dispatch()  # tries = 1
    for _ in range(3):
        assert work(max_jobs=1) == ["RELEASED"]
        assert QueuedJob.objects.get(id=handle.id).attempts == 0
    assert JobRun.objects.filter(label="released:overlap").count() == 3
    assert not JobRun.objects.filter(label="overlap").exists()
    store.force_release(KEY)
    assert work() == ["DONE"]
    assert not FailedJob.objects.exists()


def test_release_after_delays_the_retry(store):
    assert store.acquire(KEY, "someone-else")
    before = timezone.now()
    handle = Overlap("k", release_after=30).dispatch()
    assert work() == ["RELEASED"]
    delay = QueuedJob.objects.get(id=handle.id).available_at - before
    assert datetime.timedelta(seconds=29) < delay < datetime.timedelta(seconds=32)


def test_laravel_counting_fails_an_overlapping_job_that_never_ran(store, settings):
    """§15.6 with DEFERRALS_CONSUME_ATTEMPTS: tries=1 runs out on the next pop."""
    settings.JOBGUARD = {**settings.JOBGUARD, "DEFERRALS_CONSUME_ATTEMPTS": True}
    assert store.acquire(KEY, "someone-else")
    Overlap("k").dispatch()
    assert work() == ["RELEASED", "FAILED"]
    assert FailedJob.objects.get().exception_class.endswith("MaxAttemptsExceededError")
    assert not JobRun.objects.filter(label="overlap").exists()


def test_laravel_counting_with_retry_until_keeps_retrying(store, settings):
    class Patient(Overlap):
        name = "tests.PatientOverlap"

        def retry_until(self):
            return timezone.now() + datetime.timedelta(hours=1)

    settings.JOBGUARD = {**settings.JOBGUARD, "DEFERRALS_CONSUME_ATTEMPTS": True}
    assert store.acquire("jobguard:overlap:tests.PatientOverlap:k", "someone-else")
    handle = Patient("k").dispatch()
    for _ in range(4):
        assert work(max_jobs=1) == ["RELEASED"]
    assert QueuedJob.objects.get(id=handle.id).attempts == 4
    store.force_release("jobguard:overlap:tests.PatientOverlap:k")
    assert work() == ["DONE"]


def test_dont_release_drops_the_job_and_frees_its_unique_lock(store):
    assert store.acquire("jobguard:overlap:tests.support.lock_jobs.UniqueOverlap:k", "someone-else")
    UniqueOverlap("k", dont_release=True).dispatch()
    assert work() == ["SKIPPED"]  # deleted as done: no failed job, no retry
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert store.get_lock(lock_key(UniqueOverlap("k"))) is None


def test_lock_is_released_when_handle_raises(store):
    Overlap("k", outcome="raise").dispatch()
    assert work() == ["FAILED"]
    assert store.get_lock(KEY) is None


def test_lock_is_released_when_the_job_times_out(store):
    class Sleepy(Overlap):
        name = "tests.SleepyOverlap"
        timeout = 0.5

    Sleepy("k", seconds=10).dispatch()
    assert work() == ["FAILED"]
    assert FailedJob.objects.get().exception_class.endswith("JobTimeoutError")
    assert store.get_lock("jobguard:overlap:tests.SleepyOverlap:k") is None


def _nested(outer: Overlap, inner: Overlap) -> Overlap:
    """Run ``inner`` (its middleware and handle) while ``outer`` holds its lock."""

    def outer_handle(job):
        run_middleware(inner)

    outer.context = JobContext(job_id="outer-job")
    inner.context = JobContext(job_id="inner-job")
    outer.middleware()[0].handle(outer, outer_handle)
    return inner


def test_shared_key_excludes_across_classes_and_plain_keys_do_not(store):
    blocked = _nested(Overlap("inv-1", shared=True), OtherOverlap("inv-1", shared=True))
    assert blocked.context.requested == Outcome.deferred(
        NOW, reason="overlap", detail="overlap lock 'inv-1' was held")
    assert not blocked.context.handle_started
    ran = _nested(Overlap("inv-1"), OtherOverlap("inv-1"))
    assert ran.context.requested is None and ran.context.handle_returned
    same_class = _nested(Overlap("inv-1"), Overlap("inv-1"))
    assert same_class.context.requested is not None
    other_key = _nested(Overlap("inv-1"), Overlap("inv-2"))
    assert other_key.context.handle_returned
    assert store.locks() == []


def test_a_stale_run_does_not_release_the_newer_holders_lock(store):
    job = Overlap("k")
    job.context = JobContext(job_id="old-run")
    seen = {}

    def handle_that_loses_its_lock(j):
        seen["owner"] = store.get_lock(KEY).owner
        store.force_release(KEY)  # say it expired while we ran
        seen["newer"] = store.acquire(KEY, "newer-run")

    job.middleware()[0].handle(job, handle_that_loses_its_lock)
    assert seen["owner"].startswith("old-run:") and len(seen["owner"]) > len("old-run:")
    info = store.get_lock(KEY)
    assert (info.owner, info.token) == ("newer-run", seen["newer"])
    assert info.token > job.lock_token


def test_each_run_has_its_own_owner(store):
    owners = []
    job = Overlap("k")
    job.context = JobContext(job_id="same-job")
    for _ in range(2):
        job.middleware()[0].handle(job, lambda j: owners.append(store.get_lock(KEY).owner))
    assert owners[0] != owners[1] and all(o.startswith("same-job:") for o in owners)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("renew, outcome", [(True, "held"), (False, "lost")])
def test_renewal_keeps_a_short_lock_while_the_job_runs(store, renew, outcome):
    lock_jobs.RenewProbe("r", renew=renew).dispatch()
    assert work() == ["DONE"]
    assert lock_jobs.EVENTS[0][:2] == ("renew", outcome)
    assert store.get_lock("jobguard:overlap:tests.support.lock_jobs.RenewProbe:r") is None
    assert not [t for t in threading.enumerate() if t.name.startswith("jobguard-renew")]


# -- function jobs ---------------------------------------------------------------------------


def test_unique_decorator_above_job(store):
    assert issubclass(lock_jobs.sync_user.job_class, ShouldBeUnique)
    assert lock_jobs.sync_user.name == "tests.support.lock_jobs.sync_user"
    assert registry.get("tests.support.lock_jobs.sync_user") is lock_jobs.sync_user.job_class
    assert lock_jobs.sync_user.job_class.unique_for == 60
    assert lock_jobs.sync_user.dispatch(1)
    assert not lock_jobs.sync_user.dispatch(1)
    assert lock_jobs.sync_user.dispatch(2)
    assert work() == ["DONE", "DONE"]
    assert sorted(lock_jobs.EVENTS) == [("sync_user", 1), ("sync_user", 2)]
    assert lock_jobs.sync_user.dispatch(1)  # released after success
    assert lock_jobs.sync_user(5) is None and lock_jobs.EVENTS[-1] == ("sync_user", 5)


def test_unique_until_processing_decorator_below_job(store):
    job_class = lock_jobs.import_user.job_class
    assert issubclass(job_class, ShouldBeUniqueUntilProcessing) and job_class.tries == 2
    assert lock_jobs.import_user.dispatch(1)
    assert not lock_jobs.import_user.dispatch(1)
    assert work() == ["DONE"]


def test_without_overlapping_decorators_share_a_key_across_function_jobs(store):
    for fn in (lock_jobs.charge, lock_jobs.refund):
        (factory,) = fn.job_class.middleware_factories
        (middleware,) = fn.job_class(7).middleware()
        assert middleware.lock_key(fn.job_class(7)) == "jobguard:overlap:inv:7"
        assert middleware.expire_after == 30 and middleware.shared
    assert store.acquire("jobguard:overlap:inv:7", "a-refund-elsewhere")
    lock_jobs.charge.dispatch(7)
    lock_jobs.refund.dispatch(7)
    lock_jobs.charge.dispatch(8)
    assert sorted(work(max_jobs=3)) == ["DONE", "RELEASED", "RELEASED"]
    assert lock_jobs.EVENTS == [("charge", 8, "tests.support.lock_jobs.charge")]
    store.force_release("jobguard:overlap:inv:7")
    assert sorted(work()) == ["DONE", "DONE"]


def test_stacked_unique_and_overlap_decorators(store):
    fn = lock_jobs.unique_and_exclusive
    assert issubclass(fn.job_class, ShouldBeUnique)
    assert [type(m) for m in fn.job_class(1).middleware()] == [WithoutOverlapping]
    assert fn.dispatch(1) and not fn.dispatch(1) and fn.dispatch(2)
    assert store.acquire("jobguard:overlap:tests.support.lock_jobs.unique_and_exclusive:all", "x")
    assert work(max_jobs=2) == ["RELEASED", "RELEASED"]
    assert not fn.dispatch(1)  # deferred, still unique
    store.force_release("jobguard:overlap:tests.support.lock_jobs.unique_and_exclusive:all")
    make_due()
    assert work() == ["DONE", "DONE"]
    assert fn.dispatch(1)


def test_decorated_middleware_order_is_top_down(scratch_jobs):
    def outer_key(n):
        return "outer"

    def inner_key(n):
        return "inner"

    def fn(n):
        return n

    fn.__qualname__ = "order_probe"  # module level as far as @job is concerned
    decorated = without_overlapping(key=outer_key, expire_after=5)(
        job(without_overlapping(key=inner_key, expire_after=5)(fn)))
    keys = [m.key for m in decorated.job_class(1).middleware()]
    assert keys == ["outer", "inner"]


def test_decorator_misuse_is_a_clear_error():
    from django_jobguard import unique

    with pytest.raises(TypeError, match=r"@unique\(key=...\) takes a function"):
        unique(key="user")
    with pytest.raises(TypeError, match=r"@without_overlapping\(key=...\) takes a function"):
        without_overlapping(key=5)
    with pytest.raises(ValueError, match="renew=True"):
        without_overlapping(renew=True)
    with pytest.raises(ValueError, match="unique_for=...\\) must be seconds"):
        unique(unique_for=-1)
    with pytest.raises(TypeError, match="already unique"):
        unique()(lock_jobs.sync_user)
    with pytest.raises(TypeError, match="goes on a module-level function"):
        without_overlapping(expire_after=1)(Overlap)


# -- jobguard.W002 --------------------------------------------------------------------------


class _Unbounded(Overlap):
    abstract = True

    def middleware(self):
        return [WithoutOverlapping(self.key)]


class _ExplicitZero(Overlap):
    abstract = True

    def middleware(self):
        return [WithoutOverlapping(self.key, shared=True, expire_after=0)]


class _Bounded(Overlap):
    abstract = True

    def middleware(self):
        return [WithoutOverlapping(self.key, expire_after=90)]


class _Dynamic(Overlap):
    abstract = True

    def middleware(self):
        options = {"expire_after": 0}
        return [WithoutOverlapping(self.key, **options)]  # cannot be told statically


def test_has_unbounded_overlap_reads_middleware_source_and_decorator_options():
    assert has_unbounded_overlap(_Unbounded) and has_unbounded_overlap(_ExplicitZero)
    assert not has_unbounded_overlap(_Bounded) and not has_unbounded_overlap(_Dynamic)
    assert not has_unbounded_overlap(Overlap)  # expire_after=self.options...: a variable
    assert not has_unbounded_overlap(lock_jobs.UniqueRecord)  # no middleware at all
    assert not has_unbounded_overlap(lock_jobs.charge.job_class)  # expire_after=30

    def fn(n):
        return n

    fn.__qualname__ = "unbounded_probe"
    flagged = job(without_overlapping(key=lambda n: n)(fn))
    assert has_unbounded_overlap(flagged.job_class)
    registry.register(type("W002Probe", (_Unbounded,), {"name": "tests.W002Probe",
                                                        "__module__": __name__}))
    warnings = check_overlap_expiry()
    registry.unregister(flagged.name)
    registry.unregister("tests.W002Probe")
    flagged_names = sorted(w.msg.split()[0] for w in warnings)
    assert flagged_names == [
        "tests.W002Probe", "tests.unit.middleware.test_without_overlapping.unbounded_probe"]
    assert {w.id for w in warnings} == {"jobguard.W002"}
    assert "expire_after" in warnings[0].hint
    assert check_overlap_expiry() == []  # the registered jobs of the test suite are fine
