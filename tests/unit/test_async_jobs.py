"""Async jobs (issue 13): ``async def handle()`` and ``@job`` on an ``async def`` run through the
whole pipeline; their timeout and an operator's cancel cancel their task; definition errors."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from demo.models import JobRun, Profile
from django.utils import timezone

from django_jobguard import (
    Job,
    RateLimited,
    ShouldBeUniqueUntilProcessing,
    Skip,
    ThrottlesExceptions,
    WithoutOverlapping,
    aio,
    job,
    rate_limiter,
)
from django_jobguard.exceptions import JobTimeoutError
from django_jobguard.middleware import JobMiddleware
from django_jobguard.models import FailedJob, JobResult, QueuedJob
from django_jobguard.stores import get_store
from django_jobguard.testing import drain
from tests.support import async_jobs, async_long_jobs

pytestmark = pytest.mark.django_db


def test_an_async_job_runs_with_the_async_orm_and_is_acked():
    handle = async_jobs.AsyncRecord("a", seconds=0.01).dispatch()
    result = drain()
    assert result.states == ["DONE"]
    run = JobRun.objects.get()
    assert run.label == "a" and run.job_id == handle.id and run.attempt == 1
    assert run.ended_at is not None
    assert not QueuedJob.objects.exists()


def test_aget_and_asave_see_the_rows_of_the_callers_transaction():
    profile = Profile.objects.create(name="old")
    async_jobs.AsyncRename(profile.pk, "new").dispatch()
    assert drain().states == ["DONE"]
    profile.refresh_from_db()
    assert (profile.name, profile.syncs) == ("new", 1)


def test_an_async_function_job_keeps_its_result():
    handle = async_jobs.async_add.dispatch(2, 3)
    assert drain().states == ["DONE"]
    assert JobResult.objects.get(id=handle.id).return_value == 5


def test_dispatch_sync_runs_an_async_job_to_its_end():
    assert async_jobs.async_add.dispatch_sync(4, 5) == 9
    assert async_jobs.AsyncRecord("now").dispatch_sync() == "now"
    assert JobRun.objects.get().label == "now"


@pytest.fixture
def seen():
    async_jobs.SEEN.clear()
    yield async_jobs.SEEN
    async_jobs.SEEN.clear()


def test_the_timeout_cancels_the_task_and_the_retry_policy_decides(seen):
    async_jobs.AsyncSlow(30, label="t").dispatch()  # tries=2, timeout=1
    # The first try times out and is retried (backoff 0: due at once); the last fails.
    assert drain().states == ["RELEASED", "FAILED"]
    failed = FailedJob.objects.get()
    assert failed.exception_class.endswith("JobTimeoutError") and failed.attempts == 2
    assert "timed out after 1 s" in failed.message
    assert [s[2] for s in seen] == [1, 2]
    assert list(JobRun.objects.values_list("key", flat=True)) == ["cancelled", "cancelled"]


def test_an_operator_cancel_ends_the_task_as_cancelled_not_failed(seen):
    handle = async_long_jobs.AsyncCancelsItself().dispatch()
    result = drain()
    assert result.states == ["CANCELLED"] and result.cancelled == 1
    assert seen == [("cancel", "stopping"), ("task cancelled", True)]
    assert not QueuedJob.objects.filter(id=handle.id).exists()
    assert not FailedJob.objects.exists()


# -- middleware on async jobs ------------------------------------------------------------------


class _Trace(JobMiddleware):
    """A user's sync-only middleware: it runs off the loop, around the awaited handle()."""

    def handle(self, job, next):
        async_jobs.SEEN.append(("before", aio.in_event_loop()))
        result = next(job)
        async_jobs.SEEN.append(("after", result))
        return result


@pytest.fixture
def traced(scratch_jobs, seen):
    class Traced(Job):
        name = "tests.async.Traced"

        def middleware(self):
            return [_Trace(), Skip.unless(lambda job: True)]

        async def handle(self):
            async_jobs.SEEN.append(("handle", aio.in_event_loop()))
            return 7

    return Traced


def test_a_sync_only_middleware_wraps_the_awaited_handle_off_the_loop(traced, seen):
    assert traced().dispatch_sync() == 7
    traced().dispatch()
    assert drain().states == ["DONE"]
    assert seen == [("before", False), ("handle", True), ("after", 7)] * 2


def test_skip_drops_an_async_job_without_running_it(scratch_jobs, seen):
    class Skipped(Job):
        name = "tests.async.Skipped"

        def middleware(self):
            return [Skip.when(lambda job: True)]

        async def handle(self):
            async_jobs.SEEN.append("ran")

    Skipped().dispatch()
    assert drain().states == ["SKIPPED"]
    assert seen == []


def test_without_overlapping_defers_an_async_job_while_another_holds_the_lock(store_alias):
    job = async_long_jobs.AsyncRenewed("second", seconds=0)
    store = get_store(store_alias)
    key = job.middleware()[0].lock_key(job)
    assert store.acquire(key, "someone-else", ttl=30) is not None
    job.dispatch()
    assert drain().states == ["RELEASED"]
    row = QueuedJob.objects.get()
    assert row.attempts == 0 and "overlap lock" in row.wait_reason  # a deferral: no try used
    store.release(key, "someone-else")
    assert drain(delayed=True).states == ["DONE"]
    run = JobRun.objects.get()
    assert run.token is not None and run.ended_at is not None
    assert store.get_lock(key) is None  # released after the awaited handle()


def test_rate_limited_admits_one_async_job_and_defers_the_next(scratch_jobs, store_alias):
    rate_limiter.define("async-one", "1/minute")

    class Limited(Job):
        name = "tests.async.Limited"

        def middleware(self):
            return [RateLimited("async-one")]

        async def handle(self):
            await asyncio.sleep(0)
            return "ran"

    try:
        Limited().dispatch()
        Limited().dispatch()
        assert sorted(drain().states) == ["DONE", "RELEASED"]
        assert QueuedJob.objects.get().wait_reason == "rate limit 'async-one' was full"
    finally:
        rate_limiter.remove("async-one")


def test_throttles_exceptions_counts_an_async_jobs_exception_and_opens(scratch_jobs,
                                                                       store_alias):
    class Flaky(Job):
        name = "tests.async.Flaky"
        tries = 5

        def middleware(self):
            return [ThrottlesExceptions(max_attempts=1, decay_seconds=60, backoff=60)]

        async def handle(self):
            await asyncio.sleep(0)
            raise ConnectionError("service down")

    Flaky().dispatch()
    Flaky().dispatch()
    # The first exception is counted (released by the middleware, its error kept) and opens
    # the circuit: the second job is deferred without running.
    assert drain().states == ["RELEASED", "RELEASED"]
    ran, deferred = sorted(QueuedJob.objects.all(), key=lambda row: -row.attempts)
    assert ran.attempts == 1 and "ConnectionError: service down" in ran.last_error
    assert deferred.attempts == 0 and deferred.wait_reason.endswith("was open")


def test_throttles_exceptions_counts_an_async_jobs_timeout_as_a_sync_one(scratch_jobs,
                                                                         store_alias):
    """A sync job's timeout reaches the middleware as JobTimeoutError and is counted; an
    async job's is a cancellation of its task: counted the same."""
    class Hangs(Job):
        name = "tests.async.Hangs"
        tries = 1
        timeout = 1

        def __init__(self, seconds: float = 30):
            self.seconds = seconds

        def middleware(self):
            return [ThrottlesExceptions(max_attempts=1, decay_seconds=60, backoff=60)]

        async def handle(self):
            await asyncio.sleep(self.seconds)

    Hangs().dispatch()
    assert drain().states == ["FAILED"]  # timed out
    Hangs(0).dispatch()
    assert drain().states == ["RELEASED"]  # the timeout opened the circuit
    assert QueuedJob.objects.get().wait_reason.endswith("was open")


#: Set by a ``_dropping`` job as it awaits.
STARTED = threading.Event()


def _dropping(label: str, delete_when, *, seconds: float = 0.3, cancels_itself: bool = False):
    """An async job whose handle() awaits past its timeout (``seconds``) inside a circuit
    that drops the job on ``delete_when`` (tries are left: a timeout alone would retry it).
    It asks for its own cancel first with ``cancels_itself``; it sets :data:`STARTED` as it
    awaits."""
    class Dropping(Job):
        tries, backoff = 3, 60
        name, timeout = f"tests.async.{label}", seconds

        def middleware(self):
            return [ThrottlesExceptions(max_attempts=1, decay_seconds=60,
                                        delete_when=delete_when).by("dropping")]

        async def handle(self):
            if cancels_itself:
                from django_jobguard import operations

                await sync_to_async(operations.cancel_job)(self.job_id)
            STARTED.set()
            await asyncio.sleep(30)

    return Dropping


def _counted(store) -> int:
    """Failures the ``dropping`` circuit holds."""
    info = next((c for c in store.throttles() if c.key == "jobguard:circuit:dropping"), None)
    return 0 if info is None else info.hits


def test_an_operator_cancel_is_not_a_drop_whatever_delete_when_takes(scratch_jobs,
                                                                      store_alias):
    """The cancel ends the task, as a timeout does: only the timeout is delete_when's."""
    handle = _dropping("CancelledDropping", lambda exc: True, seconds=30,
                       cancels_itself=True)().dispatch()
    result = drain()
    assert result.states == ["CANCELLED"] and result.cancelled == 1
    assert not QueuedJob.objects.filter(id=handle.id).exists()
    assert not FailedJob.objects.exists() and _counted(get_store(store_alias)) == 0


# -- a job cancelled while its middleware takes a lock or enters a circuit off the loop ---------
# The call goes on in its thread after the task is cancelled (a thread cannot be stopped):
# what it took must be given back, not left held (a lock renewed for ever, a probe leased).


def _slow_first(monkeypatch, store, method: str, seconds: float = 0.6) -> list:
    """``store.<method>`` outlasts the job's timeout the first time; the list gets what
    each call returned."""
    real = getattr(store, method)
    returned: list = []

    def slow(*args, **kwargs):
        if not returned:
            time.sleep(seconds)
        returned.append(real(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(store, method, slow)
    return returned


class _LongLease(ThrottlesExceptions):
    """A probe's lease of 10 minutes, whatever the job's timeout: one never freed blocks."""

    def probe_lease(self, job):
        return 600


def _overlapping_job(renew: bool):
    class Overlapping(Job):
        name = "tests.async.CancelledOverlapping"
        timeout = 0.2
        tries = 3

        def middleware(self):
            return [WithoutOverlapping("k", expire_after=5, renew=renew, release_after=30)]

        async def handle(self):
            async_jobs.SEEN.append("ran")

    return Overlapping


def _probing_job():
    class Probing(Job):
        name = "tests.async.CancelledProbe"
        timeout = 0.2
        tries = 1  # the probe's owner is its job id: its retry would be let in anyway

        def middleware(self):
            return [_LongLease(max_attempts=1, decay_seconds=0.05)]

        async def handle(self):
            async_jobs.SEEN.append("ran")

    return Probing


def _half_open(store, key: str) -> None:
    """Open circuit ``key`` (one failure of ``_probing_job``'s), its decay over: the next job
    to enter it is its probe."""
    settings = {"max_attempts": 1, "decay": 0.05}
    assert store.circuit_enter(key, owner="before", probe_lease=600, **settings).admitted
    store.circuit_leave(key, owner="before", outcome="failure", **settings)
    time.sleep(0.1)


def test_an_async_job_timed_out_while_it_takes_its_overlap_lock_releases_it(
        scratch_jobs, store_alias, seen, monkeypatch):
    store = get_store(store_alias)
    taken = _slow_first(monkeypatch, store, "acquire")
    job = _overlapping_job(renew=False)()
    key = job.middleware()[0].lock_key(job)
    job.dispatch()
    # The first run times out as the lock is taken and is retried at once: the lock was
    # released, not left to defer every later run of the key as an overlap.
    assert drain().states == ["RELEASED", "DONE"]
    assert taken[0] is not None and seen == ["ran"]
    assert store.get_lock(key) is None and not QueuedJob.objects.exists()


def test_an_async_job_timed_out_while_it_enters_a_circuit_frees_its_probe(
        scratch_jobs, store_alias, seen, monkeypatch):
    store = get_store(store_alias)
    job = _probing_job()()
    key = job.middleware()[0].circuit_key(job)
    _half_open(store, key)
    entered = _slow_first(monkeypatch, store, "circuit_enter")
    job.dispatch()
    # The first job was admitted as the probe as it timed out: the probe is freed (not
    # leased 10 minutes), and the next job probes in its place and closes the circuit.
    assert drain().states == ["FAILED"]
    assert entered[0].admitted and entered[0].probe and seen == []
    job.dispatch()
    assert drain().states == ["DONE"]
    assert seen == ["ran"] and circuit_state(store, key) in (None, "closed")


def circuit_state(store, key):
    return next((c.state for c in store.throttles() if c.key == key), None)




def _wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def _process_on_the_worker_loop(worker_id: str) -> str:
    from django_jobguard import queue
    from django_jobguard.worker.pipeline import Pipeline

    (row,) = queue.claim(["default"], worker_id=worker_id, limit=1, start=1)
    return aio.loop_thread().run(Pipeline(worker_id=worker_id, event_loop=True).aprocess(row))


@pytest.mark.django_db(transaction=True)
def test_on_the_worker_loop_a_lock_taken_as_the_job_timed_out_is_released(
        scratch_jobs, seen, monkeypatch, loop_connections):
    """Review B: with renew=True the lock was renewed for ever by its renewer thread, and
    every later run of the key was deferred as an overlap."""
    import threading

    store = get_store()
    taken = _slow_first(monkeypatch, store, "acquire")
    job = _overlapping_job(renew=True)()
    key = job.middleware()[0].lock_key(job)
    job.dispatch()
    assert _process_on_the_worker_loop("w-overlap") == "RELEASED"  # timed out, retried
    _wait_for(lambda: taken)  # (the run ended once the lock it took was released)
    assert taken[0] is not None and store.get_lock(key) is None
    assert not [t for t in threading.enumerate() if t.name == f"jobguard-renew:{key}"]
    assert _process_on_the_worker_loop("w-overlap") == "DONE"
    assert seen == ["ran"] and store.get_lock(key) is None
    assert not QueuedJob.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_on_the_worker_loop_a_probe_admitted_as_the_job_timed_out_is_freed(
        scratch_jobs, seen, monkeypatch, loop_connections):
    store = get_store()
    job = _probing_job()()
    key = job.middleware()[0].circuit_key(job)
    _half_open(store, key)
    entered = _slow_first(monkeypatch, store, "circuit_enter")
    job.dispatch()
    assert _process_on_the_worker_loop("w-probe") == "FAILED"  # timed out as it entered
    _wait_for(lambda: entered)
    assert entered[0].admitted and entered[0].probe
    state = next(c for c in store.throttles() if c.key == key)
    assert state.state == "half-open" and state.resets_at <= store.now()  # free to probe
    job.dispatch()
    assert _process_on_the_worker_loop("w-probe") == "DONE"
    assert seen == ["ran"] and circuit_state(store, key) in (None, "closed")
    assert not QueuedJob.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_on_the_worker_loop_a_timeout_delete_when_takes_drops_the_job(scratch_jobs,
                                                                       loop_connections):
    """As a sync job's: before, its timeout went on to the worker's timeout rules (a retry)."""
    _dropping("TimedOutDropping", JobTimeoutError)().dispatch()
    assert _process_on_the_worker_loop("w-drop") == "SKIPPED"
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert _counted(get_store()) == 0


@pytest.mark.django_db(transaction=True)
def test_on_the_worker_loop_a_stop_is_not_a_drop_whatever_delete_when_takes(scratch_jobs,
                                                                             loop_connections):
    from django_jobguard import queue
    from django_jobguard.worker.pipeline import Pipeline

    STARTED.clear()
    handle = _dropping("StoppedDropping", lambda exc: True, seconds=30)().dispatch()
    (row,) = queue.claim(["default"], worker_id="w-stop", limit=1, start=1)
    future = aio.loop_thread().submit(Pipeline(worker_id="w-stop", event_loop=True)
                                      .aprocess(row))
    assert STARTED.wait(5)
    aio.stop_all()
    assert future.result(timeout=10) == "RELEASED"  # back to the queue, not dropped
    row = QueuedJob.objects.get(id=handle.id)
    assert row.attempts == 0 and not row.last_error  # a stop uses no try and is no error
    assert not FailedJob.objects.exists() and _counted(get_store()) == 0


def test_an_async_unique_until_processing_job_frees_its_lock_as_it_starts(scratch_jobs):
    class Once(ShouldBeUniqueUntilProcessing, Job):
        name = "tests.async.Once"

        async def handle(self):
            # The lock is free while it runs: a copy may be queued meanwhile.
            return bool(await sync_to_async(Once().dispatch)())

    assert Once().dispatch()
    assert not Once().dispatch()  # the lock holds while it waits
    handle = QueuedJob.objects.get()
    assert drain(recursive=False).states == ["DONE"]
    assert QueuedJob.objects.exclude(id=handle.id).count() == 1


# -- definitions that could never run ----------------------------------------------------------


def test_an_async_generator_is_refused_at_definition(scratch_jobs):
    with pytest.raises(TypeError, match="is a generator .it yields."):
        class Yields(Job):
            name = "tests.async.Yields"

            async def handle(self):
                yield 1

    with pytest.raises(TypeError, match="it is an async generator"):
        @job
        async def stream(n):
            yield n


def test_an_async_method_the_worker_calls_synchronously_is_refused(scratch_jobs):
    with pytest.raises(TypeError, match=r"failed\(\) is 'async def'.*only handle\(\) may be"):
        class BadFailed(Job):
            name = "tests.async.BadFailed"

            async def handle(self):
                return None

            async def failed(self, exception):
                return None

    with pytest.raises(TypeError, match=r"middleware\(\) is 'async def'"):
        class BadMiddleware(Job):
            name = "tests.async.BadMiddleware"

            async def middleware(self):
                return []


def test_job_with_a_base_of_the_other_kind_is_refused(scratch_jobs):
    from django_jobguard.decorators import AsyncFunctionJob, FunctionJob

    async def fetch(): ...

    def compute(): ...

    fetch.__qualname__ = compute.__qualname__ = "module_level"  # as if at module level
    class SyncBase(FunctionJob):
        abstract = True

    assert job(base=FunctionJob)(fetch).job_class.is_async  # the default base adapts
    with pytest.raises(TypeError, match="use a base of the same kind"):
        job(base=SyncBase)(fetch)
    with pytest.raises(TypeError, match="use a base of the same kind"):
        job(base=AsyncFunctionJob)(compute)


def test_a_sync_handle_that_returns_a_coroutine_fails_with_a_clear_error(scratch_jobs):
    class Forgot(Job):
        name = "tests.async.Forgot"

        def handle(self):
            return asyncio.sleep(0)  # meant 'async def handle' / 'await'

    Forgot().dispatch()
    assert drain().states == ["FAILED"]
    assert "returned a coroutine without awaiting it" in FailedJob.objects.get().message


def test_inline_mode_runs_an_async_job_at_dispatch():
    from django_jobguard.testing import inline

    with inline():
        async_jobs.AsyncRecord("inline").dispatch()
    assert JobRun.objects.get().label == "inline"
    assert not QueuedJob.objects.exists()


def test_on_the_worker_loop_broken_connections_are_dropped_where_the_jobs_orm_ran(monkeypatch):
    """Issue 27 item 1: the threads an async job's own ORM calls use in a worker (asgiref's
    thread-sensitive one; a sync-only middleware's own thread) close what a database restart
    broke; nothing else would, and every later job would fail on it."""
    import threading

    from django_jobguard import aio, queue
    from django_jobguard.context import JobContext
    from django_jobguard.middleware.chain import run_middleware_async

    closed: list[str] = []
    monkeypatch.setattr(queue, "close_broken_connections",
                        lambda **kwargs: closed.append(threading.current_thread().name))

    class SyncOnly:
        def handle(self, job, next):
            return next(job)

    class Wrapped:
        name, is_async = "tests.Wrapped", True

        def __init__(self) -> None:
            self.context = JobContext(job_id="1")

        def middleware(self):
            return [SyncOnly()]

        async def handle(self):
            return "done"

    loop = aio.loop_thread()
    assert loop.run(run_middleware_async(Wrapped())) == "done"
    assert len(closed) == 1 and closed[0] != loop.thread.name  # in the middleware's thread
    loop.run(aio.reset_job_connections())  # after a run that raised
    assert len(closed) == 2 and closed[1] != loop.thread.name


def test_the_row_after_an_async_job_begins_in_the_hop_that_writes_its_outcome(monkeypatch):
    """Issue 29: an async job whose slot goes to a row claimed ahead starts and rebuilds that
    row in the same call off the loop that writes its own outcome, so the next job runs with
    one hop to a thread, not two; both run once, each on its first attempt."""
    from asgiref.sync import async_to_sync

    from django_jobguard import queue
    from django_jobguard.worker.pipeline import Pipeline

    first = async_jobs.AsyncRecord("hop", key="first").dispatch()
    second = async_jobs.AsyncRecord("hop", key="second").dispatch()
    rows = queue.claim(["default"], worker_id="w-hop", limit=2, start=1)
    assert [str(row.id) for row in rows] == [first.id, second.id]
    assert queue.claimed_ahead(rows[1])
    pipeline = Pipeline(worker_id="w-hop")
    hops: list[str] = []
    call_sync = aio.call_sync

    async def counted(func, *args, **kwargs):
        hops.append(func.__name__)
        return await call_sync(func, *args, **kwargs)

    monkeypatch.setattr(aio, "call_sync", counted)

    state = async_to_sync(pipeline.aprocess)(rows[0], then=lambda: rows[1])
    assert state == "DONE" and hops == ["begin", "_finish"]
    state = async_to_sync(pipeline.aprocess)(rows[1])
    assert state == "DONE" and hops == ["begin", "_finish", "_finish"]  # begun already
    assert not QueuedJob.objects.exists()
    assert sorted((run.key, run.attempt) for run in JobRun.objects.filter(label="hop")) == [
        ("first", 1), ("second", 1)]


def test_a_row_begun_after_an_async_job_that_its_start_ended_keeps_that_state(monkeypatch):
    """The row begun in the outcome's hop may end there (here: its cancel was requested
    while it waited in the buffer): it is not run, and its state is the one returned."""
    from asgiref.sync import async_to_sync

    from django_jobguard import queue
    from django_jobguard.worker.pipeline import Pipeline

    async_jobs.AsyncRecord("hop", key="first").dispatch()
    second = async_jobs.AsyncRecord("hop", key="second").dispatch()
    rows = queue.claim(["default"], worker_id="w-hop", limit=2, start=1)
    rows[1].cancel_requested_at = timezone.now()
    pipeline = Pipeline(worker_id="w-hop")
    assert async_to_sync(pipeline.aprocess)(rows[0], then=lambda: rows[1]) == "DONE"
    assert async_to_sync(pipeline.aprocess)(rows[1]) == "CANCELLED"
    assert [run.key for run in JobRun.objects.filter(label="hop")] == ["first"]
    assert not QueuedJob.objects.filter(id=second.id).exists()


def test_a_job_that_returns_wakes_its_waiter_in_its_tasks_last_step():
    # The task's own done callbacks run a turn of the loop after its last step, and the
    # waiter woken by one another turn later: a turn more per job than needed.
    from django_jobguard.context import JobContext

    async def main():
        turns = 0

        def tick():
            nonlocal turns
            turns += 1
            loop.call_soon(tick)

        async def quick():
            return "done"

        loop = asyncio.get_running_loop()
        loop.call_soon(tick)
        result = await aio.run_job(JobContext(job_id="1"), quick(), timeout=0, label="quick")
        return result, turns

    result, turns = asyncio.run(main())
    assert result == "done"
    assert turns <= 2  # its first step, then this coroutine woken (3 before)


def test_a_job_stopped_before_its_first_step_still_ends_its_run(monkeypatch):
    # A stop_all() that came while its task was made cancels the task before its first step
    # (Python 3.11 starts no task eagerly): the job's coroutine never runs, and only the
    # task's done callback can end the wait.
    from django_jobguard.context import JobContext
    from django_jobguard.exceptions import WorkerStoppedError

    made = aio._eager_task

    def made_as_a_stop_came(loop, coro, name):
        task = asyncio.Task(coro, loop=loop, name=name)  # not started (as on 3.11)
        aio._stops += 1  # what stop_all() does meanwhile
        return task

    monkeypatch.setattr(aio, "_eager_task", made_as_a_stop_came)
    ran = []

    async def job():
        ran.append(True)

    async def main():
        return await asyncio.wait_for(
            aio.run_job(JobContext(job_id="1"), job(), timeout=0, label="stopped"), 10)

    with pytest.raises(WorkerStoppedError):
        aio.loop_thread().run(main())
    assert ran == []
    monkeypatch.setattr(aio, "_eager_task", made)
