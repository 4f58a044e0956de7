"""A job's time limit inside the worker process (SIGALRM, main thread only), backed by the
watchdog process for jobs that no signal interrupts (:mod:`django_jobguard.watchdog`).

In another thread (``jobworker --threads``) no signal reaches the job: :func:`time_limit`
registers the limit as a :class:`ThreadLimit` instead, and the worker's coordinator asks
:func:`overdue_threads` and raises the timeout into the job's thread with
:func:`raise_in_thread` (between two bytecodes, as SIGALRM does; a thread inside C code or a
blocking call gets it when that returns). A job still running :data:`GRACE` seconds later is
given up by the executor (see :mod:`django_jobguard.executor`)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django_jobguard import watchdog
from django_jobguard.exceptions import JobTimeoutError

logger = logging.getLogger("django_jobguard.worker")

#: Seconds a job that swallowed its JobTimeoutError (or whose clean-up hangs) gets before the
#: worker process exits; the watchdog kills it :data:`watchdog.MARGIN` later.
GRACE = 5.0


def hard_limit(seconds: float) -> float:
    """Seconds after its start at which a job with ``timeout=seconds`` ends with its worker
    process, whatever it runs (the lease must outlast this, check W003)."""
    return seconds + GRACE + watchdog.MARGIN


@contextmanager
def time_limit(seconds: float, *, finished: Callable[[], bool] = lambda: False,
               label: str = "a job") -> Iterator[None]:
    """Raise :class:`JobTimeoutError` in the job after ``seconds`` (main thread only).

    Once ``finished()`` (``handle()`` has returned or raised) the time is not up for the
    job any more: raising then would only interrupt the middleware's clean-up (an overlap
    lock left until it expires, a completed run retried). If the job swallows the error,
    or the clean-up hangs, the process exits after a grace period; the supervisor starts
    a new worker and the job's lease brings it back. A job in C code that holds the GIL runs
    no signal handler: the watchdog process (``label`` names the job in its message) kills
    the worker at :func:`hard_limit`.
    """
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        with _thread_limit(seconds, finished, label):
            yield
        return
    fired = False

    def on_alarm(signum: int, frame: Any) -> None:
        nonlocal fired
        if fired:
            logger.critical("The job did not end within its timeout and a grace period; "
                            "exiting the worker process.")
            os._exit(1)
        fired = True
        signal.setitimer(signal.ITIMER_REAL, GRACE)  # grace period
        if finished():
            logger.warning("The job's time ran out after handle() finished; letting its "
                           "middleware finish.")
            return
        raise JobTimeoutError(f"The job has timed out after {seconds:g} s.")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    dog = watchdog.for_this_process()
    dog.arm(hard_limit(seconds), label)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        dog.disarm()


# -- limits of jobs running in other threads -----------------------------------------------


@dataclass
class ThreadLimit:
    """The time limit of a job running in a thread other than the main one."""

    thread_id: int
    seconds: float
    deadline: float  # time.monotonic()
    finished: Callable[[], bool]
    label: str
    #: Set once the timeout was raised into the thread (it is raised once).
    raised: bool = False


_limits: dict[int, ThreadLimit] = {}
_limits_lock = threading.Lock()


@contextmanager
def _thread_limit(seconds: float, finished: Callable[[], bool],
                  label: str) -> Iterator[None]:
    ident = threading.get_ident()
    limit = ThreadLimit(ident, seconds, time.monotonic() + seconds, finished, label)
    with _limits_lock:
        _limits[ident] = limit
    try:
        yield
    finally:
        with _limits_lock:
            if _limits.get(ident) is limit:
                del _limits[ident]


def thread_limit(thread_id: int) -> ThreadLimit | None:
    """The limit of the job running in the thread ``thread_id`` now, if it has one."""
    with _limits_lock:
        return _limits.get(thread_id)


def overdue_threads(thread_ids: Container[int], now: float | None = None) -> list[ThreadLimit]:
    """The limits of ``thread_ids`` whose time is up and whose timeout was not raised yet."""
    now = time.monotonic() if now is None else now
    with _limits_lock:
        return [limit for ident, limit in _limits.items()
                if ident in thread_ids and not limit.raised and limit.deadline <= now]


class ThreadTimeoutError(JobTimeoutError):
    """:class:`JobTimeoutError` as raised into a worker thread (an exception raised into
    another thread is given as a class, so its message is built where it lands)."""

    def __init__(self, *args: Any) -> None:
        if not args:
            limit = thread_limit(threading.get_ident())
            seconds = f" after {limit.seconds:g} s" if limit is not None else ""
            args = (f"The job has timed out{seconds}.",)
        super().__init__(*args)


def raise_in_thread(thread_id: int, error: type[BaseException]) -> bool:
    """Raise ``error`` (a class) in the thread ``thread_id`` at its next bytecode (CPython's
    ``PyThreadState_SetAsyncExc``); False if no such thread runs."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(error))
    if done > 1:  # never expected: undo, as the C API asks
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
        return False
    return done == 1


def expire_thread_limits(thread_ids: Container[int]) -> list[ThreadLimit]:
    """Raise :class:`ThreadTimeoutError` into each of ``thread_ids`` whose job is out of
    time (not once ``handle()`` has finished: its middleware's clean-up goes on, as in
    :func:`time_limit`); returns the limits that ran out now."""
    expired = []
    for limit in overdue_threads(thread_ids):
        limit.raised = True
        expired.append(limit)
        if limit.finished():
            logger.warning("%s: its time ran out after handle() finished; letting its "
                           "middleware finish.", limit.label)
            continue
        logger.warning("%s has run past its timeout of %g s; raising the timeout in its "
                       "thread.", limit.label, limit.seconds)
        raise_in_thread(limit.thread_id, ThreadTimeoutError)
    return expired
