"""Async jobs: ``async def handle(self)`` (and ``@job`` on an ``async def``) run on an event loop.

One event loop per worker process runs in its own thread (:class:`LoopThread`, started on the
first async job): sync jobs never run on it, and many async jobs await on it at once
(``jobworker --async-concurrency N``). :func:`run_job` runs one job's middleware and
``handle()`` as a task with its time limit: a ``timeout`` cancels the task (the job sees
``asyncio.CancelledError`` at its current ``await``), so is an operator's cancel (the flag is
read about once a second: on the worker's loop by one :class:`CancelPoller` for all its jobs),
so is a second Ctrl-C. A job that swallows the cancellation is given up
on after a grace period (logged; its task is left to end on its own). In a jobworker the
pipeline also arms the watchdog's hard limit around each run
(:func:`~django_jobguard.worker.timeouts.watched`): a job that blocks the loop past it is
ended with its process, as a sync job is.

A job that blocks the loop (``time.sleep()``, a sync ORM call through ``sync_to_async`` missing,
CPU work) stops every other async job of the worker. A probe thread asks the loop to answer
every few tenths of a second; when it has not answered for
``JOBGUARD['ASYNC_BLOCKED_AFTER']`` seconds the worker logs a warning naming the job that
holds it.

Code that must stay synchronous inside an async job (a store, a middleware, a signal) goes
through :func:`call_sync`, Django's ``sync_to_async(thread_sensitive=True)``: under
``drain()``/inline mode that is the caller's thread (and its test transaction), in a worker
the one thread Django's async ORM uses too. Nothing else closes that thread's connection,
so a run that raised closes it if it is broken (:func:`reset_job_connections`), before its
outcome is written.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import async_to_sync, sync_to_async

from django_jobguard.exceptions import JobCancelledError, JobTimeoutError, WorkerStoppedError

if TYPE_CHECKING:
    from django_jobguard.context import JobContext

logger = logging.getLogger("django_jobguard.worker")

T = TypeVar("T")

#: Seconds between two probes of the loop (the threshold itself is a setting).
PROBE_INTERVAL = 0.2
#: Threads of the worker loop's pool for jobguard's sync calls (stores, acks).
POOL_SIZE = 4
#: Seconds between two reads of a running async job's cancel flag.
CANCEL_POLL = 1.0
#: Methods the worker calls synchronously: an ``async def`` there would never be awaited.
SYNC_METHODS = ("middleware", "failed", "retry_until", "unique_id", "unique_via", "__init__")


# -- what is an async job ------------------------------------------------------------------------


def check_job_class(cls: type) -> bool:
    """Whether ``cls`` is an async job (its ``handle`` is ``async def``); ``TypeError`` at
    definition time for what could never run: an async generator as ``handle``, or an
    ``async def`` on a method the worker calls synchronously."""
    handle = getattr(cls, "handle", None)
    where = f"{cls.__module__}.{cls.__qualname__}"
    if inspect.isasyncgenfunction(handle) or inspect.isgeneratorfunction(handle):
        raise TypeError(f"{where}.handle() is a generator (it yields); a job's handle() must "
                        f"be a plain 'def' or 'async def' that returns its result.")
    for name in SYNC_METHODS:
        method = cls.__dict__.get(name)
        if isinstance(method, (staticmethod, classmethod)):
            method = method.__func__
        if method is not None and (inspect.iscoroutinefunction(method)
                                   or inspect.isasyncgenfunction(method)):
            raise TypeError(f"{where}.{name}() is 'async def', but the worker calls it "
                            f"synchronously; only handle() may be async. Make {name}() a "
                            f"plain 'def'.")
    return inspect.iscoroutinefunction(handle)


def check_function(func: Callable[..., Any]) -> bool:
    """Whether ``@job``'s ``func`` is ``async def``; ``TypeError`` for a generator."""
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        kind = "an async generator" if inspect.isasyncgenfunction(func) else "a generator"
        raise TypeError(f"@job cannot run {func.__module__}.{func.__qualname__}: it is {kind} "
                        f"(it yields). A job function is a plain 'def' or 'async def' that "
                        f"returns its result.")
    return inspect.iscoroutinefunction(func)


def is_async(job: Any) -> bool:
    """Whether ``job`` (a job or a job class) runs on the event loop."""
    return bool(getattr(job, "is_async", False))


def in_event_loop() -> bool:
    """Whether this thread is running an event loop (sync database calls would fail here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def on_worker_loop() -> bool:
    """Whether this thread is the worker's event loop thread (not ``drain()``'s)."""
    current = _loop_thread
    return current is not None and threading.current_thread() is current.thread


async def call_sync(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``func(*args, **kwargs)`` off the loop, where the ORM may be used. On the worker's
    loop: in its small pool of threads (jobguard's own calls, so that they do not queue
    behind the jobs' ORM calls); elsewhere (``drain()``, inline mode) in the calling thread,
    which holds the test's transaction."""
    current = _loop_thread
    if current is not None and threading.current_thread() is current.thread:
        return await current.pool.call(lambda: _reset_after(func, *args, **kwargs))
    return await sync_to_async(func, thread_sensitive=True)(*args, **kwargs)


async def acquire_sync(acquire: Callable[..., T | None], release: Callable[[T], Any],
                       *args: Any, **kwargs: Any) -> T | None:
    """:func:`call_sync` for a call that takes something that must be given back (a lock,
    a circuit's probe). A thread cannot be stopped: when the awaiting task is cancelled (its
    timeout, an operator's cancel, a stop) while ``acquire`` runs, ``acquire`` still runs to
    its end, and what it returned would be lost, held for good. Here the cancelled task
    waits for it and gives it to ``release`` (off the loop as well) before the
    ``CancelledError`` goes on. Nothing is released for ``None``, for an ``acquire`` that
    raised, or for one that never started. Not cancelled, it costs what :func:`call_sync`
    does (no extra task, turn of the loop or hop to a thread)."""
    current = _loop_thread
    if current is None or threading.current_thread() is not current.thread:
        return await _acquire_elsewhere(acquire, release, *args, **kwargs)
    late = _Late()
    future = current.pool.call(lambda: _reset_after(acquire, *args, **kwargs), late)
    try:
        return await future
    except asyncio.CancelledError:
        if future.cancelled():  # cancelled with it: its outcome is handed to ``late``
            if current.pool.withdraw(future):
                raise  # still queued, taken back: it never runs, nothing to give back
            if late.outcome is None:
                late.waiter = current.loop.create_future()
                await _despite_cancel(late.waiter)
            assert late.outcome is not None
            ok, value = late.outcome
        else:  # it had ended; the task was cancelled before it resumed
            ok = future.exception() is None
            value = future.result() if ok else None
        if ok and value is not None:
            await _release_late(current.pool.call(lambda: _reset_after(release, value)),
                                release)
        raise


class _Late:
    """The outcome (``ok``, value) of a call whose awaiter was cancelled, handed over by
    :meth:`Offload._deliver` on the loop; wakes ``waiter`` if one waits for it."""

    __slots__ = ("outcome", "waiter")

    def __init__(self) -> None:
        self.outcome: tuple[bool, Any] | None = None
        self.waiter: asyncio.Future[None] | None = None

    def __call__(self, ok: bool, value: Any) -> None:
        self.outcome = (ok, value)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


async def _acquire_elsewhere(acquire: Callable[..., T | None], release: Callable[[T], Any],
                             *args: Any, **kwargs: Any) -> T | None:
    """:func:`acquire_sync` off the worker's loop (``drain()``, inline mode): asgiref's
    ``sync_to_async`` drops the result of a call whose awaiter was cancelled, so the call
    runs as a task of its own, shielded."""
    task = asyncio.ensure_future(sync_to_async(acquire, thread_sensitive=True)(*args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            value = await _despite_cancel(task)
        except Exception:
            value = None  # it raised: nothing taken
        if value is not None:
            await _release_late(asyncio.ensure_future(
                sync_to_async(release, thread_sensitive=True)(value)), release)
        raise


async def _despite_cancel(future: asyncio.Future[T]) -> T:
    """``future``'s result, waited for even if the awaiting task is cancelled (again)
    meanwhile: it is already on its way out with a ``CancelledError``."""
    while True:
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done():
                return future.result()


async def _release_late(future: asyncio.Future[Any], release: Callable[..., Any]) -> None:
    """Wait for ``release`` (running as ``future``) in a task being cancelled: what it
    raises is logged, the ``CancelledError`` goes on."""
    try:
        await _despite_cancel(future)
    except Exception:
        logger.exception("Could not give back what %s took as its job was cancelled.",
                         getattr(release, "__qualname__", release))


def _reset_after(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``func()`` in a pool thread, dropping a connection it broke."""
    try:
        return func(*args, **kwargs)
    finally:
        _close_broken()


def _close_broken() -> None:
    from django_jobguard.queue import close_broken_connections  # models: after app loading

    close_broken_connections()


async def reset_job_connections() -> None:
    """After an async job that raised, on the worker's loop: close the connection its own
    async ORM calls broke. Those calls (``aget()``, ``sync_to_async``) run on asgiref's one
    thread-sensitive thread, where nothing else would ever close it: after a database restart
    every later async job would fail with "the connection is closed" (Django closes it at the
    end of a request the same way, ``close_old_connections``)."""
    if not on_worker_loop():
        return
    try:
        await sync_to_async(_close_broken, thread_sensitive=True)()
    except Exception as exc:  # the job's outcome is written anyway
        logger.warning("Could not close the async ORM's broken connection (%s).", exc)


def closing_broken(func: Callable[..., T]) -> Callable[..., T]:
    """``func`` run in a thread of its own (a sync middleware of an async job), dropping the
    connection it broke as it returns."""
    def run(*args: Any, **kwargs: Any) -> T:
        return _reset_after(func, *args, **kwargs)

    return run


# -- one job's run -------------------------------------------------------------------------------

TIMEOUT = "timeout"
CANCELLED = "cancelled"
STOPPED = "stopped"
#: Seconds a cancelled task (its timeout, an operator's cancel) is waited for before it is
#: given up on; a worker passes its own grace period (``worker.timeouts.GRACE``).
GIVE_UP_AFTER = 5.0


class JobRun:
    """One async job's task, and why it was cancelled (``timeout``, ``cancelled``,
    ``stopped``; ``None`` while nobody did)."""

    def __init__(self, task: asyncio.Task[Any] | None, context: JobContext, label: str,
                 grace: float = GIVE_UP_AFTER) -> None:
        self.task: asyncio.Task[Any] = task  # type: ignore[assignment]  # (or set by run_job)
        self.context, self.label, self.grace = context, label, grace
        self.reason: str | None = None
        #: Set as :meth:`body` starts, and as it returns, in the task's last step (done
        #: before any other task runs).
        self.began = self.returned = False
        #: Whether the worker stopped waiting for a task that would not end.
        self.given_up = False
        self._grace: asyncio.TimerHandle | None = None
        self._waiters: list[asyncio.Future[None]] = []

    async def body(self, coro: Coroutine[Any, Any, T]) -> T:
        """What the task runs: ``coro``, then whoever waits in :meth:`ended` is woken in the
        same step. (The task's own done callbacks run a turn of the loop later: awaiting
        only those cost a turn per job.)"""
        self.began = True
        try:
            return await coro
        finally:
            self.returned = True
            for waiter in self._waiters:
                _wake(waiter)

    def ended(self) -> asyncio.Future[None]:
        """A future done once the task is, or once it was given up on (one future and a
        callback, not ``asyncio.wait()`` over a second task: this is on every job's path).
        :meth:`body` wakes it; the task's done callback too, for a task cancelled before its
        first step (``coro`` never ran)."""
        waiter: asyncio.Future[None] = self.task.get_loop().create_future()
        if self.returned or self.task.done() or self.given_up:
            waiter.set_result(None)
            return waiter
        self._waiters.append(waiter)
        self.task.add_done_callback(lambda _task: _wake(waiter))
        return waiter

    def cancel(self, reason: str) -> None:
        """Cancel the task (first reason wins); after the grace period stop waiting for it.
        Not once ``handle()`` has returned: the job is done, only its middleware's clean-up
        is left (cut short, a stop would put a finished job back in the queue to run again,
        a cancel would record a finished one as cancelled), as for a sync job
        (:meth:`~django_jobguard.worker.pipeline.Pipeline.interruptible`); a stop still
        ends the wait for it after the grace period: the job counted as done if its
        ``handle()`` returned, put back if it raised."""
        if self.task.done() or self.reason is not None:
            return
        if self.context.handle_finished:
            if reason == STOPPED and self._grace is None:  # the wait still ends: see _give_up
                self._grace = asyncio.get_running_loop().call_later(self.grace, self._give_up,
                                                                    self.grace)
            return
        self.reason = self.context.cut_short = reason
        self.task.cancel(f"jobguard: {reason}")
        self._grace = asyncio.get_running_loop().call_later(self.grace, self._give_up,
                                                            self.grace)

    def stop_threadsafe(self) -> None:
        """From another thread: cancel the task because the worker stops at once."""
        self.task.get_loop().call_soon_threadsafe(self.cancel, STOPPED)

    def time_up(self, seconds: float) -> None:
        if self.context.handle_finished:  # only the middleware's clean-up is left: let it
            logger.warning("%s: its time ran out after handle() finished; letting its "
                           "middleware finish.", self.label)
            return
        logger.warning("%s timed out after %g s; cancelling it.", self.label, seconds)
        self.cancel(TIMEOUT)

    def _give_up(self, grace: float) -> None:
        """The grace period after a cancel or a stop ran out: stop waiting for the task."""
        if self.task.done():
            return
        if self.reason is None:  # a stop after handle() ended
            handled = "returned" if self.context.handle_returned else "raised"
            counts = ("the job counts as done" if self.context.handle_returned
                      else "the job goes back to the queue")
            logger.critical("%s: its handle() %s, its middleware has not ended %g s after the "
                            "worker's stop; the worker stops waiting for it (%s), its task is "
                            "left running on the loop.", self.label, handled, grace, counts)
        else:
            logger.critical("%s was cancelled (%s) and has not ended %g s later (it swallows "
                            "asyncio.CancelledError?); the worker stops waiting for it, its task "
                            "is left running on the loop.", self.label, self.reason, grace)
        self.given_up = True
        for waiter in self._waiters:
            _wake(waiter)

    def close(self) -> None:
        if self._grace is not None:
            self._grace.cancel()


#: The async jobs running in this process, by task (the loop probe names them).
_runs: dict[asyncio.Task[Any], JobRun] = {}
_runs_lock = threading.Lock()


def running_labels() -> list[str]:
    """Labels of the async jobs running now in this process."""
    with _runs_lock:
        return [run.label for run in _runs.values()]


def running() -> list[JobRun]:
    with _runs_lock:
        return list(_runs.values())


#: How many times :func:`stop_all` ran: a job whose first step ran as its task was made
#: (not yet in ``_runs`` then, see :func:`run_job`) checks it did not miss one.
_stops = 0


def stop_all() -> None:
    """From any thread: stop every async job running in this process at once (each ends
    with :class:`WorkerStoppedError` and goes back to the queue)."""
    global _stops
    with _runs_lock:
        _stops += 1
        runs = list(_runs.values())
    for job_run in runs:
        job_run.stop_threadsafe()


if sys.version_info >= (3, 12):
    def _eager_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T],
                    name: str) -> asyncio.Task[T]:
        """A task whose first step runs now, as the current task (Python 3.12's
        ``eager_start``): a job that never waits ends here, with no step scheduled."""
        return asyncio.Task(coro, loop=loop, name=name, eager_start=True)
else:
    def _eager_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T],
                    name: str) -> asyncio.Task[T]:
        """Python 3.11 has no eager start (a first step run outside its task would see
        the caller's task as ``current_task()``: ``asyncio.timeout()``, ``TaskGroup``)."""
        return loop.create_task(coro, name=name)


async def run_job(context: JobContext, coro: Coroutine[Any, Any, T], *, timeout: float,
                  label: str, grace: float = GIVE_UP_AFTER) -> T:
    """Run ``coro`` (a job's middleware and ``handle()``) as a task named after ``label``.

    Returns its result, or raises what it raised; :class:`JobTimeoutError` when ``timeout``
    cancelled it (or it swallowed that cancellation), :class:`JobCancelledError` when an
    operator's cancel did (``context.cancel_seen`` is then set), :class:`WorkerStoppedError`
    when the worker stopped at once. A task that swallows its cancellation is given up on
    after ``grace`` seconds. (A jobworker also arms the watchdog's hard limit around this:
    a job that blocks the loop runs neither its cancellation nor the heartbeat.)"""
    loop = asyncio.get_running_loop()
    current = _loop_thread
    if current is None or threading.current_thread() is not current.thread:
        current = None  # not the worker's loop: a timer and a watcher of its own
    run = JobRun(None, context, label, grace)
    if current is not None:  # the worker's loop: its first step now (Python 3.12+)
        stops, begun = _stops, loop.time()  # (its timeout counts that step too)
        task = _eager_task(loop, run.body(coro), label)
    else:  # another loop: its own task factory
        task = loop.create_task(run.body(coro), name=label)
    run.task = task
    if task.done():  # it ended in its first step: no timeout, cancel or stop to watch for
        return _result(run, timeout)
    with _runs_lock:
        _runs[task] = run
        missed = current is not None and _stops != stops
    if missed:  # a stop_all() came while its first step ran
        run.cancel(STOPPED)
    timer = watcher = None
    limits = poller = None
    if timeout:
        if current is not None:
            limits = current.time_limits()  # one timer for all the worker's jobs
            limits.add(run, timeout, since=begun)
        else:
            timer = loop.call_later(timeout, run.time_up, timeout)
    if context.reporter is not None:
        if current is not None:
            poller = current.cancel_poller()  # one task for all the worker's jobs
            poller.add(run)
        else:
            watcher = loop.create_task(_watch_cancel(run))
    try:
        await run.ended()
    except asyncio.CancelledError:  # whoever awaits us was cancelled: stop the job too
        run.cancel(STOPPED)
        await run.ended()
        raise
    finally:
        for handle in (timer, watcher):
            if handle is not None:
                handle.cancel()
        run.close()
        if not run.began:  # its task was cancelled before its first step
            coro.close()  # (never awaited: no warning about it)
        if limits is not None:
            limits.discard(run)
        if poller is not None:
            poller.discard(run)
        with _runs_lock:
            _runs.pop(task, None)
    return _result(run, timeout)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _result(run: JobRun, timeout: float) -> Any:
    task = run.task
    if run.given_up and run.reason is None:  # handle() ended; its middleware outlasted a
        if run.context.handle_returned:  # stop's grace: done (put back, it would run again)
            return None
        raise WorkerStoppedError(WorkerStoppedError.detail)  # it raised: not a success
    if run.reason == TIMEOUT:
        error = JobTimeoutError(f"The job has timed out after {timeout:g} s.")
        own = task.exception() if task.done() and not task.cancelled() else None
        if own is not None and not isinstance(own, asyncio.CancelledError):
            raise own  # it turned the cancellation into its own error
        raise error
    if run.reason == CANCELLED:
        run.context.cancel_seen = True
        if task.done() and not task.cancelled() and task.exception() is None:
            return task.result()  # it finished as it was cancelled: ends as cancelled anyway
        raise JobCancelledError("An operator cancelled the job.")
    if run.reason == STOPPED or task.cancelled() or not task.done():
        raise WorkerStoppedError(WorkerStoppedError.detail)
    return task.result()


async def _watch_cancel(run: JobRun) -> None:
    """Read the job's cancel flag once a second (off the loop); cancel the task when set."""
    reporter = run.context.reporter
    assert reporter is not None  # started only for a run that has one
    while not run.task.done():
        await asyncio.sleep(CANCEL_POLL)
        try:
            if await call_sync(reporter.cancelled):
                run.cancel(CANCELLED)
                return
        except Exception as exc:  # the flag is advice: the job goes on
            logger.warning("Could not read the cancel flag of %s (%s).", run.label, exc)


class TimeLimits:
    """The timeouts of the async jobs on the worker's loop, on one timer set for the earliest
    deadline. A timer per job, set as it started and cancelled as it ended, stayed in the
    loop's heap of timers until it came due or the heap was rebuilt (with a 60 s timeout,
    every job of the last minute's: a heap of hundreds of thousands at thousands of jobs a
    second). A job whose deadline is later than the timer's leaves the timer alone; when
    it fires, the jobs whose time is up are timed out and it is set for the earliest left.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: Each run's deadline (``loop.time()``) and timeout (seconds).
        self.runs: dict[JobRun, tuple[float, float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at: float | None = None  # when the timer fires (``loop.time()``)

    def add(self, run: JobRun, seconds: float, *, since: float | None = None) -> None:
        """On the loop: time ``run`` out ``seconds`` after ``since`` (``loop.time()``; now
        by default), unless :meth:`discard` first (a deadline already past: at once)."""
        deadline = (self.loop.time() if since is None else since) + seconds
        self.runs[run] = (deadline, seconds)
        if self._at is None or deadline < self._at:
            self._set(deadline)

    def discard(self, run: JobRun) -> None:
        """``run`` ended (the timer stays: it finds nothing due and is set for the next)."""
        self.runs.pop(run, None)

    def _set(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = self.loop.call_at(at, self._fire), at

    def _fire(self) -> None:
        self._timer = self._at = None
        now = self.loop.time()
        due = [(run, seconds) for run, (deadline, seconds) in self.runs.items()
               if deadline <= now]
        for run, seconds in due:
            del self.runs[run]
            try:
                run.time_up(seconds)
            except Exception:  # one run's failure must not keep the others from timing out
                logger.exception("Timing out %s failed.", run.label)
        if self.runs:
            self._set(min(deadline for deadline, _ in self.runs.values()))


class CancelPoller:
    """Reads the cancel flags of the async jobs on the worker's loop, each about once every
    :data:`CANCEL_POLL` seconds, in one task and one call off the loop for all of them (a
    task per job, with its timer and its cancellation, cost every no-op job as much as its
    run). A job's first read comes :data:`CANCEL_POLL` to 1.25 times that after it started."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: The runs watched, each with when its flag was last read (``loop.time()``).
        self.runs: dict[JobRun, float] = {}
        self._wanted: asyncio.Future[None] | None = None
        self._task = loop.create_task(self._run(), name="jobguard-cancel-poller")

    def add(self, run: JobRun) -> None:
        """On the loop: watch ``run`` until :meth:`discard`."""
        self.runs[run] = self.loop.time()
        wanted = self._wanted
        if wanted is not None and not wanted.done():
            wanted.set_result(None)

    def discard(self, run: JobRun) -> None:
        self.runs.pop(run, None)

    async def _run(self) -> None:
        while True:
            if not self.runs:  # idle: no wake-ups until a job starts
                self._wanted = self.loop.create_future()
                await self._wanted
            await asyncio.sleep(CANCEL_POLL / 4)
            try:
                await self._read_due()
            except Exception:  # never let a bug stop the reads of the jobs to come
                logger.exception("Reading the cancel flags of the async jobs failed.")

    async def _read_due(self) -> None:
        now = self.loop.time()
        due = [run for run, read in self.runs.items()
               if now - read >= CANCEL_POLL and run.reason is None and not run.task.done()]
        if not due:
            return
        flags = await call_sync(_read_flags, due)
        read = self.loop.time()
        for run, flag in zip(due, flags, strict=True):
            if run in self.runs:
                self.runs[run] = read
                if flag:
                    run.cancel(CANCELLED)


def _read_flags(runs: list[JobRun]) -> list[bool]:
    """Off the loop: each run's cancel flag (``False`` when it could not be read)."""
    flags = []
    for run in runs:
        reporter = run.context.reporter
        try:
            flags.append(reporter is not None and reporter.cancelled())
        except Exception as exc:  # the flag is advice: the job goes on
            logger.warning("Could not read the cancel flag of %s (%s).", run.label, exc)
            flags.append(False)
    return flags


# -- the worker's loop ---------------------------------------------------------------------------


class Offload:
    """The worker loop's threads for sync calls (:func:`call_sync`: the jobs' outcomes
    written, stores), handed their work and giving back their results in batches.

    ``run_in_executor`` wakes a thread for every call and the loop for every result (a
    byte through its self-pipe, a hand-over of the GIL each way): for no-op async jobs
    that cost more than the jobs. Here a thread that is already working takes the calls
    queued meanwhile without being woken, and its results reach the loop in one wake-up
    once it has nothing queued (or, as a call ends, once the oldest waited
    :data:`DELIVER_AFTER`). Calls still run side by
    side: another thread is woken when those working have been on their call for
    :data:`STALLED_AFTER` (a slow store does not hold back the acks queued behind it)."""

    #: Seconds a working thread's call may take before a queued call wakes another thread.
    STALLED_AFTER = 0.02
    #: Seconds a result may wait for the thread's next ones before it is handed back alone.
    DELIVER_AFTER = 0.001

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, name: str) -> None:
        self.loop, self.size, self.name = loop, size, name
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[tuple[asyncio.Future[Any], Callable[[], Any],
                                             Callable[[bool, Any], Any] | None]] = \
            collections.deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for work
        self._waking = 0  # threads woken (or started) that have not taken a call yet
        self._working: dict[int, float] = {}  # thread id: when its call began (monotonic)
        self._results: list[tuple[asyncio.Future[Any], bool, Any,
                                  Callable[[bool, Any], Any] | None]] = []
        self._results_since = 0.0
        self._posted = False  # a delivery is scheduled on the loop
        self._recheck: asyncio.TimerHandle | None = None
        self._closed = False

    def call(self, func: Callable[[], T],
             abandoned: Callable[[bool, Any], Any] | None = None) -> asyncio.Future[T]:
        """On the loop: ``func()`` in one of the threads; a future of the loop.

        A call whose future is cancelled before a thread takes it is not run; one already
        running runs to its end, and its result is dropped. ``abandoned(ok, value)`` is
        then called on the loop with what came of it instead (its result, or the
        exception it raised; ``False`` and a ``CancelledError`` for a call never run)."""
        future: asyncio.Future[T] = self.loop.create_future()
        with self._cond:
            self._queue.append((future, func, abandoned))
            self._dispatch()
        return future

    def _dispatch(self) -> None:
        """On the loop, under the lock: wake (or start) a thread for the queued calls unless
        one at work will take them; else look again once it may have stalled."""
        if not self._queue:
            return
        if self._working or self._waking:  # a thread takes them when it is free
            if len(self._working) >= self.size:
                return  # every thread works: each takes the next call as it is done
            now = time.monotonic()
            # (a thread on its way to the queue counts as one that just began a call)
            latest = now if self._waking else max(self._working.values())
            if now - latest < self.STALLED_AFTER:
                if self._recheck is None:
                    self._recheck = self.loop.call_later(
                        latest + self.STALLED_AFTER - now, self._look_again)
                return
        if self._idle > self._waking:
            self._waking += 1
            self._cond.notify()
        elif len(self._threads) < self.size:
            self._waking += 1  # on its way to the queue as well
            thread = threading.Thread(target=self._work, daemon=True,
                                      name=f"{self.name}_{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def _look_again(self) -> None:
        with self._cond:
            self._recheck = None
            self._dispatch()

    def _work(self) -> None:
        ident = threading.get_ident()
        cond = self._cond
        with cond:
            self._waking -= 1
            while True:
                while not self._queue:
                    if self._closed:
                        return
                    self._idle += 1
                    cond.wait()
                    self._idle -= 1
                    if self._waking:
                        self._waking -= 1
                future, func, abandoned = self._queue.popleft()
                self._working[ident] = time.monotonic()
                if self._results and not self._posted and not self._queue:
                    # The last call queued may be a slow one: the results held for the
                    # batch go back now, not after it (a result so waits at most for the
                    # calls queued behind it, each woken elsewhere after STALLED_AFTER).
                    self._posted = True
                    if not self._post():
                        return
                if future.cancelled():  # its awaiter went away before it started
                    if abandoned is None:
                        del self._working[ident]  # (the results held went back above)
                        continue
                    func = _never_run  # (its awaiter is told)
                cond.release()
                try:
                    result, ok = func(), True
                except BaseException as exc:  # handed to the awaiting coroutine
                    result, ok = exc, False
                    if isinstance(exc, StopIteration):  # a future cannot take one
                        result = RuntimeError(f"StopIteration raised in {func}")
                finally:
                    cond.acquire()
                now = time.monotonic()
                if not self._results:
                    self._results_since = now
                self._results.append((future, ok, result, abandoned))
                if not self._posted and (not self._queue
                                         or now - self._results_since >= self.DELIVER_AFTER):
                    self._posted = True
                    self._working[ident] = now  # at work (just begun) until it looks again
                    if not self._post():
                        return
                del self._working[ident]

    def _post(self) -> bool:
        """In a working thread, under the lock: schedule :meth:`_deliver` on the loop, with
        the lock released meanwhile (the write to the loop's self-pipe lets the loop take
        the GIL, and its next :meth:`call` would then wait for the lock: a thread switch
        more, each way, per delivery). The thread still counts as working, so a call queued
        meanwhile is left for it. False if the loop is closed (nobody waits any more)."""
        self._cond.release()
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            return False
        finally:
            self._cond.acquire()
        return True

    def _deliver(self) -> None:
        """On the loop: hand the results over to their awaiters."""
        with self._cond:
            results, self._results = self._results, []
            self._posted = False
        for future, ok, value, abandoned in results:
            if future.cancelled():
                if abandoned is not None:
                    try:
                        abandoned(ok, value)
                    except Exception:  # the other results are handed over all the same
                        logger.exception("Handing over the result of a cancelled call "
                                         "failed.")
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def withdraw(self, future: asyncio.Future[Any]) -> bool:
        """On the loop: take back the call of ``future`` if no thread has taken it yet
        (True: it never runs, nor is its ``abandoned`` called)."""
        with self._cond:
            for index, (queued, _, _) in enumerate(self._queue):
                if queued is future:
                    del self._queue[index]
                    return True
        return False

    def close(self) -> None:
        """Let the threads end once the calls queued are done."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()




def _never_run() -> None:
    """What a thread of :class:`Offload` runs instead of a call whose awaiter went away
    before it started, to tell its ``abandoned`` callback so."""
    raise asyncio.CancelledError("never run: its awaiter was cancelled first")


class LoopThread:
    """An event loop in a daemon thread, with a probe that logs when the loop stops answering
    for more than ``blocked_after`` seconds (0: no probe)."""

    def __init__(self, *, blocked_after: float = 1.0, name: str = "jobguard-asyncio") -> None:
        self.blocked_after = float(blocked_after or 0)
        self.loop = asyncio.new_event_loop()
        #: Threads for jobguard's own sync calls of async jobs (stores, the queue rows).
        self.pool = Offload(self.loop, POOL_SIZE, f"{name}-sync")
        self._closed = threading.Event()
        self._started = threading.Event()
        self._tasks: set[asyncio.Task[Any]] = set()  # those of spawn()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._started.wait()
        self.blocked_episodes = 0
        self._cancels: CancelPoller | None = None
        self._limits: TimeLimits | None = None
        self._probe: threading.Thread | None = None
        if self.blocked_after > 0:
            self._probe = threading.Thread(target=self._watch, name=f"{name}-probe",
                                           daemon=True)
            self._probe.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def time_limits(self) -> TimeLimits:
        """On the loop: the one timer of its jobs' timeouts (made on first use)."""
        if self._limits is None:
            self._limits = TimeLimits(self.loop)
        return self._limits

    def cancel_poller(self) -> CancelPoller:
        """On the loop: the task that reads its jobs' cancel flags (started on first use)."""
        if self._cancels is None:
            self._cancels = CancelPoller(self.loop)
        return self._cancels

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; a future to wait on from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def spawn(self, coro: Coroutine[Any, Any, T],
              done: Callable[[asyncio.Future[T] | concurrent.futures.Future[T]], Any]) -> None:
        """Run ``coro`` on the loop and call ``done(future)`` as it ends. From the loop's own
        thread (a job's end starting the next) it is a task made there, without the
        cross-thread hand-off of :meth:`submit` (a second future, a wake-up of the loop)."""
        if threading.current_thread() is not self.thread:
            self.submit(coro).add_done_callback(done)
            return
        task = self.loop.create_task(coro)
        self._tasks.add(task)  # the loop keeps only a weak reference to it
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(done)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it in this thread. An exception raised into
        this thread meanwhile (a second Ctrl-C) stops the job's task first."""
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                stop_all()
                try:
                    future.result(timeout=10)
                except BaseException:
                    pass
            raise

    def _watch(self) -> None:
        """The probe: post a no-op to the loop and wait for it to run."""
        while not self._closed.wait(PROBE_INTERVAL):
            answered = threading.Event()
            sent = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop is closed
                return
            if answered.wait(self.blocked_after) or self._closed.is_set():
                continue
            self.blocked_episodes += 1
            holder = self.blocking_job()
            logger.warning(
                "The worker's event loop has not answered for %.1f s: %s is blocking it, and "
                "no other async job runs meanwhile. Inside 'async def handle()' await instead "
                "of blocking (asyncio.sleep, the ORM's a-methods, an async HTTP client) or wrap "
                "blocking code in sync_to_async.", time.monotonic() - sent, holder)
            while not answered.wait(1.0) and not self._closed.is_set():
                pass
            if answered.is_set():
                logger.warning("The event loop answers again after %.1f s (%s).",
                               time.monotonic() - sent, holder)

    def blocking_job(self) -> str:
        """The job whose task the loop is running now (read from another thread), else the
        async jobs running."""
        try:
            task = asyncio.current_task(self.loop)
        except RuntimeError:
            task = None
        if task is not None:
            with _runs_lock:
                run = _runs.get(task)
            return run.label if run is not None else task.get_name()
        labels = running_labels()
        return "one of " + ", ".join(labels) if labels else "code outside any job"

    def close(self, timeout: float = 5.0) -> None:
        """Stop the probe and the loop (running tasks are abandoned)."""
        self._closed.set()
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:
            return
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        self.pool.close()


_loop_thread: LoopThread | None = None
_loop_owner = 0
_loop_lock = threading.Lock()


def loop_thread() -> LoopThread:
    """This process's event loop thread, started on first use (a forked child gets its own)."""
    global _loop_thread, _loop_owner
    with _loop_lock:
        if _loop_thread is None or _loop_owner != os.getpid() or _loop_thread.loop.is_closed():
            from django_jobguard.conf import jobguard_settings

            _loop_thread = LoopThread(blocked_after=jobguard_settings.ASYNC_BLOCKED_AFTER)
            _loop_owner = os.getpid()
            atexit.register(_loop_thread.close)
        return _loop_thread


def run_blocking(factory: Callable[[], Coroutine[Any, Any, T]], *, in_worker: bool) -> T:
    """Run the coroutine ``factory()`` to its end from sync code: on this process's loop
    thread in a worker, else with ``async_to_sync`` (``drain()``, inline mode,
    ``dispatch_sync()``), whose ``call_sync`` calls come back to this thread."""
    if in_worker:
        return loop_thread().run(factory())
    if in_event_loop():
        raise RuntimeError("An async job cannot be run synchronously from inside a running "
                           "event loop (an async view or test); await it instead, or dispatch "
                           "it to a worker.")
    async def main() -> T:
        return await factory()

    return async_to_sync(main)()
