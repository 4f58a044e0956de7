"""What an async job costs beside a sync one (issue 29): the hand-offs between the worker's
event loop and its threads. A job whose start and ack need no statement of their own (its
attempt deferred to the completion group) is begun and grouped on the loop with no hop to a
thread; anything that may need the database still takes the hop. The loop's sync calls
(:class:`aio.Offload`) wake a thread only when none is at work on them; the cancel flags of
all the loop's jobs are read by one task."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from django.dispatch import receiver

from django_jobguard import Job, aio, signals
from django_jobguard.models import QueuedJob
from django_jobguard.serialization import TAG, references_models
from django_jobguard.worker.completer import GROUPED, Completer
from django_jobguard.worker.pipeline import STARTED, Pipeline

NAME = "tests.handoffs.Nothing"


class Dialect:
    """A completion group's statement, recorded (every row is still the worker's), and the
    thread that wrote it."""

    def __init__(self) -> None:
        self.groups: list[tuple[list, list, str]] = []
        self.written = threading.Event()

    def complete(self, done, starts, reserved_by, *, relaxed=False):
        self.groups.append(([job_id for job_id, _ in done], [job_id for job_id, _ in starts],
                            threading.current_thread().name))
        self.written.set()
        return {job_id for job_id, _ in done}, {job_id for job_id, _ in starts}


@pytest.fixture
def nothing(scratch_jobs):
    class Nothing(Job):
        name = NAME

        async def handle(self):
            return None

    return Nothing


@pytest.fixture
def group():
    group = Completer(worker_id="w", using="default", window=60.0, batch_size=100,
                      dialect=Dialect())
    group._timer = object()  # no timer thread: the test writes the groups itself
    group.ran(NAME, 0.001)  # a fast class: its starts may be deferred
    return group


@pytest.fixture
def hops(monkeypatch):
    """The calls the pipeline sends off the loop, by name."""
    seen: list[str] = []
    call_sync = aio.call_sync

    async def counted(func, *args, **kwargs):
        seen.append(getattr(func, "__name__", repr(func)))
        return await call_sync(func, *args, **kwargs)

    monkeypatch.setattr(aio, "call_sync", counted)
    return seen


def _row(payload=None) -> QueuedJob:
    row = QueuedJob(id=uuid.uuid4(), name=NAME, queue="default", claims=1, attempts=0,
                    reserved_by="w", payload=payload or {"args": [], "kwargs": {}})
    row.attempt_counted, row.recovered = False, False  # claimed ahead, not recovered
    row.held_until = float("inf")  # claimed just now (its lease surely holds)
    return row


def _pipeline(group: Completer, lines: list[tuple[str, str]]) -> Pipeline:
    def log(text: str, state: str) -> None:
        lines.append((state, threading.current_thread().name))

    pipeline = Pipeline(worker_id="w", event_loop=True, log=log)
    pipeline.completer = group
    return pipeline


def test_a_job_whose_start_and_ack_wait_for_the_group_runs_with_no_hop(nothing, group, hops):
    lines: list[tuple[str, str]] = []
    pipeline = _pipeline(group, lines)
    row = _row()
    loop = aio.loop_thread()

    assert loop.run(pipeline.aprocess(row)) == GROUPED
    assert hops == []  # begun, run and grouped on the loop
    assert row.attempts == 1 and group.held() == {row.id}  # its attempt counted, in the group
    assert [state for state, _ in lines] == ["RUNNING"]  # DONE waits for the group
    group.flush()
    assert group._dialect.groups == [([row.id], [], "MainThread")]  # start and end: one row
    assert lines[-1] == ("DONE", "MainThread")  # logged by whoever wrote the group


def test_what_may_need_the_database_still_hops(nothing, group, hops):
    """A job that keeps its result is acked with it off the loop; a row whose start is not
    deferred is started off the loop."""
    lines: list[tuple[str, str]] = []
    pipeline = _pipeline(group, lines)
    loop = aio.loop_thread()

    async def grouped_on_loop(row):
        job = pipeline.begin_on_loop(row, time.monotonic())
        assert not isinstance(job, str) and job is not None
        kept = pipeline._group_on_loop(row, job, None, time.monotonic(), 0.0)
        job.keep_result = False
        return kept, pipeline._group_on_loop(row, job, None, time.monotonic(), 0.0)

    row = _row()
    original = pipeline.rebuild

    def keeping(row):
        job = original(row)
        job.keep_result = True
        return job

    pipeline.rebuild = keeping
    assert loop.run(grouped_on_loop(row)) == (None, GROUPED)

    group.ran(NAME, 120.0)  # a slow class now: its start is written as it starts
    slow = _row()

    async def begin(row):
        return pipeline.begin_on_loop(row, time.monotonic())

    assert loop.run(begin(slow)) is None and slow.attempts == 0  # nothing done on the loop
    assert hops == []


def test_a_model_argument_a_receiver_or_another_thread_keep_the_begin_off_the_loop(
        nothing, group):
    pipeline = _pipeline(group, [])
    loop = aio.loop_thread()
    model = {"args": [{TAG: "model", "model": "demo.profile", "pk": 1}], "kwargs": {}}
    assert references_models((model["args"], model["kwargs"]))
    assert not references_models(([{TAG: "uuid", "value": str(uuid.uuid4())}], {"a": [1]}))

    async def may_begin(row):
        return pipeline._loop_may_begin(row)

    assert loop.run(may_begin(_row())) is True
    assert loop.run(may_begin(_row(model))) is False
    assert pipeline._loop_may_begin(_row()) is False  # not on the worker's loop

    @receiver(signals.job_processing, weak=False)
    def processing(**kwargs):  # it may use the ORM
        return None

    try:
        assert loop.run(may_begin(_row())) is False
    finally:
        signals.job_processing.disconnect(processing)


def test_a_constructor_that_fails_on_the_loop_is_rebuilt_off_it_once_started(scratch_jobs,
                                                                              group):
    class Queries(Job):
        name = NAME

        def __init__(self):
            if aio.in_event_loop():
                raise RuntimeError("the ORM, in an event loop")

        async def handle(self):
            return None

    pipeline = _pipeline(group, [])
    row = _row()

    async def begin(row):
        return pipeline.begin_on_loop(row, time.monotonic())

    assert aio.loop_thread().run(begin(row)) is STARTED
    assert row.attempts == 1  # started once; begin(counted=True) does not start it again
    job = pipeline.begin(row, time.monotonic(), counted=True)
    assert isinstance(job, Queries) and job.context.attempt == 1 and row.attempts == 1


def test_a_group_filled_on_the_loop_is_written_by_the_timer_thread():
    group = Completer(worker_id="w", using="default", window=60.0, batch_size=2,
                      dialect=Dialect())
    rows = [_row(), _row()]
    from django_jobguard.worker.completer import Finished

    acked: list[str] = []
    group.ran(NAME, 0.001)
    for row in rows:
        assert group.defer(row)  # as the loop defers its start
        assert group.join(Finished(row, None, None, 0.0, acked=lambda e: acked.append(
            threading.current_thread().name), lost=lambda e: None), write=False)
    try:
        assert group._dialect.written.wait(10)
        [(done, starts, thread)] = group._dialect.groups
        assert done == [row.id for row in rows] and thread.startswith("jobguard-completer")
    finally:
        group.close()


# -- the loop's threads ----------------------------------------------------------------------


def test_calls_queued_while_a_thread_works_are_taken_by_it_without_waking_another():
    loop = aio.LoopThread(blocked_after=0, name="offload-test")
    try:
        async def many():
            return await asyncio.gather(*(loop.pool.call(
                lambda i=i: (i, threading.current_thread().name)) for i in range(50)))

        results = loop.run(many())
        assert [i for i, _ in results] == list(range(50))
        assert {name for _, name in results} == {"offload-test-sync_0"}
        assert len(loop.pool._threads) == 1
    finally:
        loop.close()


def test_a_stalled_call_does_not_hold_back_the_calls_queued_behind_it():
    loop = aio.LoopThread(blocked_after=0, name="offload-stall")
    release = threading.Event()
    try:
        async def stalled_and_next():
            first = loop.pool.call(lambda: (release.wait(30), threading.current_thread().name))
            await asyncio.sleep(0)
            second = await loop.pool.call(lambda: threading.current_thread().name)
            release.set()
            return (await first)[1], second

        first, second = loop.run(stalled_and_next())
        assert first != second  # ran beside the stalled one, which was still waiting
    finally:
        release.set()
        loop.close()


def test_a_result_is_not_held_back_by_a_slow_call_queued_behind_it():
    """One thread takes both calls; the first one's result reaches its awaiter while the
    second (the last queued) still runs, not once it ends."""
    loop = aio.LoopThread(blocked_after=0, name="offload-deliver")
    release = threading.Event()
    try:
        async def fast_then_slow():
            fast = loop.pool.call(lambda: "fast")
            slow = loop.pool.call(lambda: release.wait(30) and "slow")
            got = await asyncio.wait_for(fast, 10)
            slow_still_running = not slow.done()
            release.set()
            return got, slow_still_running, await slow

        assert loop.run(fast_then_slow()) == ("fast", True, "slow")
    finally:
        release.set()
        loop.close()


def test_a_result_is_not_held_back_by_a_cancelled_call_queued_behind_it():
    """The one call queued behind a finished one had its awaiter cancelled: the thread that
    skips it still hands the finished call's result back (it waited for a later call)."""
    loop = aio.LoopThread(blocked_after=0, name="offload-cancelled")
    try:
        async def first_then_cancelled():
            first = loop.pool.call(lambda: time.sleep(0.01) or "first")
            second = loop.pool.call(lambda: "second")  # queued behind it, one thread
            second.cancel()  # its awaiter went away (a job's timeout, cancel or stop)
            return await asyncio.wait_for(asyncio.shield(first), 10)

        assert loop.run(first_then_cancelled()) == "first"
    finally:
        loop.close()


def test_an_acquisition_cancelled_while_queued_is_taken_back_at_once():
    """Every thread of the worker loop's pool busy (a stuck store): a cancelled acquisition
    that no thread took yet never runs, and its task ends at once (it need not wait for a
    thread to learn that nothing was taken)."""
    gate = threading.Event()
    took: list[str] = []

    async def main():
        busy = [asyncio.ensure_future(aio.call_sync(gate.wait, 30))
                for _ in range(aio.POOL_SIZE)]
        await asyncio.sleep(0.1)  # every thread in its call
        task = asyncio.ensure_future(aio.acquire_sync(lambda: took.append("lock") or "lock",
                                                      lambda value: None))
        await asyncio.sleep(0.05)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        gate.set()
        await asyncio.gather(*busy)
        return bool(done) and task.cancelled()

    try:
        assert aio.loop_thread().run(main())
        assert took == []  # it never ran
    finally:
        gate.set()


class _OwnedLock:
    """A lock that knows which thread holds it (a plain lock does not: another thread
    holding it at the moment looks the same as the caller holding it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.owner = threading.get_ident()
        return got

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def _is_owned(self) -> bool:
        return self.owner == threading.get_ident()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_thread_posts_its_results_with_the_lock_released():
    """The post to the loop (a write to its self-pipe, which lets the loop take the GIL)
    is made without the pool's lock held by the posting thread: the loop's next call need
    not wait for it."""
    loop = aio.LoopThread(blocked_after=0, name="offload-post")
    lock = _OwnedLock()
    loop.pool._cond = threading.Condition(lock)  # before any call starts a pool thread
    posts: list[bool] = []
    post = loop.loop.call_soon_threadsafe

    def watched(callback, *args, **kwargs):
        if callback == loop.pool._deliver:
            posts.append(lock.owner != threading.get_ident())
        return post(callback, *args, **kwargs)

    loop.loop.call_soon_threadsafe = watched
    try:
        async def several():
            return await asyncio.gather(*(loop.pool.call(lambda i=i: i) for i in range(20)))

        assert loop.run(several()) == list(range(20))
        assert posts and all(posts)
    finally:
        loop.close()


def test_an_exception_reaches_the_awaiting_coroutine():
    loop = aio.LoopThread(blocked_after=0, name="offload-error")
    try:
        async def failing():
            def boom():
                raise ValueError("boom")
            with pytest.raises(ValueError, match="boom"):
                await loop.pool.call(boom)
            with pytest.raises(RuntimeError, match="StopIteration"):
                await loop.pool.call(lambda: next(iter(())))
            return await loop.pool.call(lambda: "after")

        assert loop.run(failing()) == "after"
    finally:
        loop.close()


def test_a_cancelled_calls_outcome_goes_to_its_abandoned_callback():
    """A call whose awaiter went away while it ran still ends in its thread: what came of it
    goes to its ``abandoned`` callback, on the loop; one not yet started is not run."""
    loop = aio.LoopThread(blocked_after=0, name="offload-abandoned")
    started, go = threading.Event(), threading.Event()
    ran: list[str] = []
    handed: list[tuple] = []
    try:
        async def scenario():
            running = loop.pool.call(
                lambda: (started.set(), go.wait(30), "taken")[2],
                lambda ok, value: handed.append(("running", ok, value,
                                                 threading.current_thread() is loop.thread)))
            queued = loop.pool.call(lambda: ran.append("queued"), lambda ok, value: handed.append(
                ("queued", ok, type(value).__name__)))
            queued.cancel()  # before any thread took it
            while not started.is_set():
                await asyncio.sleep(0.005)
            running.cancel()  # while it runs
            go.set()
            for _ in range(1000):
                if len(handed) == 2:
                    break
                await asyncio.sleep(0.005)
            return sorted(handed)

        assert loop.run(scenario()) == [("queued", False, "CancelledError"),
                                        ("running", True, "taken", True)]
        assert ran == []
    finally:
        go.set()
        loop.close()


def _acquiring(started: threading.Event, go: threading.Event):
    def acquire(name):
        started.set()
        go.wait(30)
        return f"lock {name}"

    return acquire


async def _cancel_once_started(task: asyncio.Future, started: threading.Event,
                               go: threading.Event) -> bool:
    """Cancel ``task`` while its call runs; whether it was still waiting for the call
    after, then let the call end and wait for the task."""
    while not started.is_set():
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.sleep(0.05)
    waiting = not task.done()
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    return waiting


def test_a_task_cancelled_while_its_acquisition_runs_gives_back_what_it_took():
    loop = aio.loop_thread()
    started, go = threading.Event(), threading.Event()
    released: list[tuple[str, bool]] = []

    def release(value):
        released.append((value, threading.current_thread() is not loop.thread))

    async def scenario():
        task = asyncio.ensure_future(aio.acquire_sync(_acquiring(started, go), release, "a"))
        return await _cancel_once_started(task, started, go), list(released)

    try:
        # the cancelled task waited for the call, then for the release (off the loop)
        assert loop.run(scenario()) == (True, [("lock a", True)])
    finally:
        go.set()


def test_off_the_worker_loop_a_cancelled_acquisition_is_given_back_too():
    # drain() and inline mode: asgiref's sync_to_async, which drops the result itself
    started, go = threading.Event(), threading.Event()
    released: list[str] = []

    async def scenario():
        task = asyncio.ensure_future(aio.acquire_sync(_acquiring(started, go),
                                                      released.append, "b"))
        return await _cancel_once_started(task, started, go), list(released)

    try:
        assert asyncio.run(scenario()) == (True, ["lock b"])
    finally:
        go.set()


def test_an_acquisition_that_ended_as_its_task_was_cancelled_is_given_back(monkeypatch):
    """The call's result reached the loop, but the task was cancelled before it resumed
    (then again while it waited for the release: it still waits for it)."""
    loop = aio.loop_thread()
    pool = loop.pool
    deliver = pool._deliver
    released: list[str] = []
    task: asyncio.Future | None = None

    def deliver_then_cancel():
        deliver()
        if task is not None and not task.done():
            task.cancel()

    async def scenario():
        nonlocal task
        monkeypatch.setattr(pool, "_deliver", deliver_then_cancel)
        task = asyncio.ensure_future(aio.acquire_sync(lambda: "lock c", released.append))
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(released)

    try:
        assert loop.run(scenario()) == ["lock c"]
    finally:
        monkeypatch.undo()


def test_an_acquisition_not_cancelled_or_that_took_nothing_is_not_given_back():
    loop = aio.loop_thread()
    released: list[object] = []
    started, go = threading.Event(), threading.Event()

    def nothing():
        started.set()
        go.wait(30)

    def failing():
        started.set()
        go.wait(30)
        raise ConnectionError("store down")

    async def scenario():
        got = await aio.acquire_sync(lambda: "lock d", released.append)
        waited = []
        for acquire in (nothing, failing):
            started.clear()
            go.clear()
            task = asyncio.ensure_future(aio.acquire_sync(acquire, released.append))
            waited.append(await _cancel_once_started(task, started, go))
        return got, waited

    try:
        assert loop.run(scenario()) == ("lock d", [True, True])
        assert released == []
    finally:
        go.set()


def test_one_task_reads_the_cancel_flags_of_every_job_on_the_worker_loop(monkeypatch):
    """Two jobs on the worker's loop, one flagged: the one poller cancels only it."""
    from django_jobguard.context import JobContext
    from django_jobguard.exceptions import JobCancelledError

    monkeypatch.setattr(aio, "CANCEL_POLL", 0.05)

    class Reporter:
        def __init__(self, flagged):
            self.flagged, self.reads = flagged, 0

        def cancelled(self):
            self.reads += 1
            return self.flagged

    def context(flagged):
        ctx = JobContext(job_id=str(uuid.uuid4()), attempt=1, worker_id="w")
        ctx.reporter = Reporter(flagged)
        return ctx

    flagged, other = context(True), context(False)
    release = asyncio.Event()

    async def both():
        async def waits():
            await release.wait()
            return "ended"

        first = asyncio.ensure_future(aio.run_job(flagged, waits(), timeout=0, label="a"))
        second = asyncio.ensure_future(aio.run_job(other, waits(), timeout=0, label="b"))
        await asyncio.sleep(0.01)
        poller = aio.loop_thread().cancel_poller()
        watched = len(poller.runs)
        with pytest.raises(JobCancelledError):
            await first
        release.set()
        return watched, await second, len(poller.runs)

    assert aio.loop_thread().run(both()) == (2, "ended", 0)
    assert flagged.reporter.reads >= 1 and other.reporter.reads >= 1


def test_the_timeouts_of_the_jobs_on_the_worker_loop_share_one_timer():
    """Jobs of three timeouts started latest-deadline first, and one that ends in time with
    the earliest: each of the three times out, none before its own timeout, in the order of
    their deadlines; the one that ended is left alone; nothing stays registered."""
    from django_jobguard.context import JobContext
    from django_jobguard.exceptions import JobTimeoutError

    async def scenario():
        loop = asyncio.get_running_loop()
        ended = []

        async def waits(name, seconds, created):
            try:
                await asyncio.sleep(30)
            finally:
                ended.append((name, seconds, loop.time() - created))

        async def quick():
            await asyncio.sleep(0)
            return "in time"

        def context():
            return JobContext(job_id=str(uuid.uuid4()), attempt=1, worker_id="w")

        runs = []
        for name, seconds in (("late", 1.2), ("early", 0.6), ("middle", 0.9)):
            # Timed from before the run is made: its deadline is taken as it begins, before
            # the job's first line (a loaded machine puts a fraction of a ms between them).
            created = loop.time()
            runs.append(asyncio.ensure_future(aio.run_job(
                context(), waits(name, seconds, created), timeout=seconds, label=name)))
        limits = aio.loop_thread().time_limits()
        await asyncio.sleep(0)
        registered = len(limits.runs)
        in_time = await aio.run_job(context(), quick(), timeout=0.3, label="quick")
        outcomes = await asyncio.gather(*runs, return_exceptions=True)
        return registered, in_time, outcomes, ended, len(limits.runs)

    registered, in_time, outcomes, ended, left = aio.loop_thread().run(scenario())
    assert registered == 3 and in_time == "in time" and left == 0
    assert all(isinstance(outcome, JobTimeoutError) for outcome in outcomes), outcomes
    assert [name for name, _, _ in ended] == ["early", "middle", "late"]
    assert all(took >= seconds for _, seconds, took in ended), ended


def test_a_job_on_the_worker_loop_is_its_own_current_task_from_its_first_step():
    """On Python 3.12+ a job's first step runs as its task is made (eager start); it is the
    current task there as later (``asyncio.timeout()`` and ``TaskGroup`` need that), a job
    that never waits returns or raises as before, and nothing stays registered."""
    from django_jobguard.context import JobContext

    def context():
        return JobContext(job_id=str(uuid.uuid4()), attempt=1, worker_id="w")

    async def names_itself():
        return asyncio.current_task().get_name()

    async def own_timeout():
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(5)
        except TimeoutError:
            return "its own timeout"

    async def raises():
        raise ValueError("no")

    async def scenario():
        first = await aio.run_job(context(), names_itself(), timeout=5, label="job-a")
        second = await aio.run_job(context(), own_timeout(), timeout=5, label="job-b")
        with pytest.raises(ValueError, match="no"):
            await aio.run_job(context(), raises(), timeout=5, label="job-c")
        return first, second, aio.running(), dict(aio.loop_thread().time_limits().runs)

    assert aio.loop_thread().run(scenario()) == ("job-a", "its own timeout", [], {})


def test_a_stop_of_every_job_while_a_first_step_runs_stops_that_job_too():
    """``stop_all()`` from another thread while a job's first step runs (the job is not in
    the registry yet when its start is eager): the job still ends as stopped."""
    from django_jobguard.context import JobContext
    from django_jobguard.exceptions import WorkerStoppedError

    async def stopped_during_first_step():
        stopper = threading.Thread(target=aio.stop_all)
        stopper.start()
        stopper.join()  # (blocks the loop: the stop is done before this step ends)
        await asyncio.sleep(5)
        return "not stopped"

    async def scenario():
        context = JobContext(job_id=str(uuid.uuid4()), attempt=1, worker_id="w")
        with pytest.raises(WorkerStoppedError):
            await aio.run_job(context, stopped_during_first_step(), timeout=30, label="s")
        return aio.running()

    assert aio.loop_thread().run(scenario()) == []


def test_a_first_step_that_blocks_past_the_timeout_is_cancelled_at_its_first_wait():
    """The timeout counts from the job's start, its first step included (on 3.12+ that step
    runs before the job is registered): a job that blocks the loop past its timeout is
    cancelled at its first ``await``, not a whole timeout later."""
    from django_jobguard.context import JobContext
    from django_jobguard.exceptions import JobTimeoutError

    seen = {}

    async def blocks_then_waits():
        loop = asyncio.get_running_loop()
        time.sleep(1.2)  # past the 1 s timeout, on the loop
        seen["blocked_until"] = loop.time()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen["cancelled_at"] = loop.time()
            raise

    async def scenario():
        context = JobContext(job_id=str(uuid.uuid4()), attempt=1, worker_id="w")
        with pytest.raises(JobTimeoutError):
            await aio.run_job(context, blocks_then_waits(), timeout=1.0, label="b")

    aio.loop_thread().run(scenario())
    # A fresh timeout after the step would cancel it 1 s after the step, never sooner.
    assert seen["cancelled_at"] - seen["blocked_until"] < 1.0, seen
