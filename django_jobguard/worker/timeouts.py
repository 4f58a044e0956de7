"""A job's time limit inside the worker process (SIGALRM, main thread only), backed by the
watchdog process for jobs that no signal interrupts (:mod:`django_jobguard.worker.watchdog`).

In an executor thread (``jobworker --threads``, see :func:`enforce_in_this_thread`) no
signal reaches the job: :func:`time_limit` registers the limit as a :class:`ThreadLimit`
instead, and the worker's coordinator raises the timeout into the job's thread
(:func:`expire_thread_limits`: between two bytecodes, as SIGALRM does; a thread inside C code
or a blocking call gets it when that returns). A job still running :data:`GRACE` seconds
later is given up by the executor (see :mod:`django_jobguard.worker.executor`). The watchdog stays
armed for the earliest hard limit of the registered jobs, armed by the job's own thread as
it starts, so that a job that holds the GIL from its first instruction on (and so keeps the
coordinator from running) still ends with the process. The main thread's job (its own slot,
:class:`_HardLimit`) and async jobs on the worker's loop (:func:`watched`) register their
hard limit too, so the watchdog is armed for the earliest hard limit of every job the
process runs. Other threads (the
embedded worker) run without a time limit, as before."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # getsignal without the enum lookup
import atexit
import ctypes
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django_jobguard.exceptions import JobTimeoutError
from django_jobguard.worker import watchdog

logger = logging.getLogger("django_jobguard.worker")

#: Seconds a job that swallowed its JobTimeoutError (or whose clean-up hangs) gets before the
#: worker process exits; the watchdog kills it :data:`watchdog.MARGIN` later.
GRACE = 5.0


def hard_limit(seconds: float) -> float:
    """Seconds after its start at which a job with ``timeout=seconds`` ends with its worker
    process, whatever it runs (the lease must outlast this, check W003)."""
    return seconds + GRACE + watchdog.MARGIN


class time_limit:  # noqa: N801 (a context manager used as a function: ``with time_limit(...)``)
    """Raise :class:`JobTimeoutError` in the job after ``seconds`` (main thread only).

    Once ``finished()`` (``handle()`` has returned or raised) the time is not up for the
    job any more: raising then would only interrupt the middleware's clean-up (an overlap
    lock left until it expires, a completed run retried). If the job swallows the error,
    or the clean-up hangs, the process exits after a grace period; the supervisor starts
    a new worker and the job's lease brings it back. A job in C code that holds the GIL runs
    no signal handler: the watchdog process (``label`` names the job in its message) kills
    the worker at :func:`hard_limit`.

    The interval timer is re-armed lazily: a job whose deadline is later than the one the
    timer is set for leaves it alone (the early alarm finds the job's time not up and sets
    the timer again for the rest), and a job that ends leaves it set. Worker jobs of one
    timeout so cost one ``setitimer`` per timeout's length, not two system calls per job.
    """

    __slots__ = ("seconds", "finished", "label", "_outer", "_inner", "_outer_hard")

    def __init__(self, seconds: float, *, finished: Callable[[], bool] = lambda: False,
                 label: str = "a job") -> None:
        self.seconds, self.finished, self.label = seconds, finished, label
        self._outer: _Alarm | None = None
        self._inner: Any = None
        self._outer_hard: _HardLimit | None = None

    def __enter__(self) -> None:
        global _alarm
        seconds = self.seconds
        if not seconds:
            return
        if threading.get_ident() != _main_ident:
            if getattr(_local, "enforced", False):
                self._inner = _thread_limit(seconds, self.finished, self.label)
                self._inner.__enter__()
            return
        # The handler stays installed between jobs (installing it costs two system calls and
        # more Python than a no-op job's run); a job that installed its own gets ours back.
        if _signal.getsignal(signal.SIGALRM) is not _on_alarm:
            signal.signal(signal.SIGALRM, _on_alarm)
            _timer.at = None  # whatever timer was set, it was not ours
        now = time.monotonic()
        hard = hard_limit(seconds)
        self._outer_hard = _enter_main(_HardLimit(now + hard, hard, self.label,
                                                  slack=watchdog.SLACK))
        deadline = now + seconds
        self._outer, _alarm = _alarm, _Alarm(seconds, self.finished, deadline)
        _timer.arm_by(deadline)

    def __exit__(self, *exc_info: Any) -> None:
        global _alarm
        if not self.seconds:
            return
        inner, self._inner = self._inner, None
        if inner is not None:  # a thread's limit
            inner.__exit__(*exc_info)
        elif threading.get_ident() == _main_ident:
            _alarm = self._outer  # the timer stays set: see the class's docstring
            if _signal.getsignal(signal.SIGALRM) is not _on_alarm:
                clear_timer()  # the job changed the handler: a late alarm must not reach it
            _exit_main(self._outer_hard)


class _Alarm:
    """The time limit of the job running in the main thread (its SIGALRM)."""

    __slots__ = ("seconds", "finished", "deadline", "fired")

    def __init__(self, seconds: float, finished: Callable[[], bool], deadline: float) -> None:
        self.seconds, self.finished = seconds, finished
        self.deadline = deadline  # time.monotonic(): the timeout, then the grace period's end
        self.fired = False


_alarm: _Alarm | None = None
#: The main thread's id (the one SIGALRM reaches): compared for every job, cheaper than
#: ``threading.current_thread() is threading.main_thread()``; a forked child's is its own.
_main_ident = threading.main_thread().ident


def _main_ident_in_child() -> None:
    global _main_ident
    _main_ident = threading.main_thread().ident  # (threading's own fork hook ran first)


os.register_at_fork(after_in_child=_main_ident_in_child)


class _Timer:
    """The process's ``ITIMER_REAL``: when it is set to fire (``time.monotonic()``)."""

    at: float | None = None

    def arm_by(self, deadline: float) -> None:
        """Make sure the timer fires no later than ``deadline``."""
        if self.at is None or self.at > deadline:
            self.set(deadline)

    def set(self, deadline: float) -> None:
        if not self.registered:  # cleared before the interpreter ends (see clear_timer)
            self.registered = True
            atexit.register(clear_timer)
        # A timer of 0 would be no timer: fire at once instead.
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 1e-6))
        self.at = deadline

    registered = False


_timer = _Timer()


def clear_timer() -> None:
    """Stop a timer left set (the worker ends, or a job changed the ``SIGALRM`` handler): a
    ``SIGALRM`` without our handler, as at the interpreter's end, would kill the process."""
    if _timer.at is not None and threading.get_ident() == _main_ident:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _timer.at = None


def _timer_not_inherited() -> None:
    """A forked child has no interval timer (POSIX): it must not count on its parent's."""
    _timer.at = None


os.register_at_fork(after_in_child=_timer_not_inherited)


def _on_alarm(signum: int, frame: Any) -> None:
    """SIGALRM: the main thread's job ran out of time (raised into it), or of its grace
    period as well (the process exits); an alarm set for an earlier job sets the timer again
    for the time this one has left."""
    _timer.at = None
    alarm = _alarm
    if alarm is None:  # no job has a limit now (a late alarm): nothing to end
        return
    now = time.monotonic()
    if now < alarm.deadline:  # set for an earlier job (a lazily left timer): not up yet
        _timer.set(alarm.deadline)
        return
    if alarm.fired:
        logger.critical("The job did not end within its timeout and a grace period; "
                        "exiting the worker process.")
        os._exit(1)
    alarm.fired = True
    alarm.deadline = now + GRACE
    _timer.set(alarm.deadline)  # grace period
    if alarm.finished():
        logger.warning("The job's time ran out after handle() finished; letting its "
                       "middleware finish.")
        return
    raise JobTimeoutError(f"The job has timed out after {alarm.seconds:g} s.")


class watched:  # noqa: N801 (a context manager used as a function)
    """Only the watchdog's hard limit, for a job run in this block (``seconds`` is its
    timeout; 0: none): an async job on the worker's loop, whose timeout cancels its task
    (the main thread's job registers its own in :class:`time_limit`). Every job of the
    process with a limit registers it, so that the watchdog is armed for the earliest (async
    jobs run many at once, beside a sync one)."""

    __slots__ = ("seconds", "label", "_limit", "_key")

    def __init__(self, seconds: float, label: str) -> None:
        self.seconds, self.label = seconds, label
        self._limit: _HardLimit | None = None
        self._key = 0

    def __enter__(self) -> None:
        if not self.seconds:
            return
        key = self._key = -next(_keys)  # never a thread's id: the coordinator raises nothing
        hard = hard_limit(self.seconds)  # for it (only the hard limit: no ThreadLimit)
        limit = self._limit = _HardLimit(time.monotonic() + hard, hard, self.label)
        with _limits_lock:
            _limits[key] = limit
            if _armed is None or limit.hard_deadline < _armed.hard_deadline:
                _rearm()  # (a later one, as async jobs of one timeout mostly are, changes nothing)

    def __exit__(self, *exc_info: Any) -> None:
        limit = self._limit
        if limit is None:
            return
        with _limits_lock:
            if _limits.pop(self._key, None) is limit and _armed is limit:
                _rearm()


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
    #: Set when the executor gave the job up (its thread is stuck): no longer armed.
    abandoned: bool = False

    #: When the watchdog kills the process if the job still runs (time.monotonic()).
    hard_deadline: float = field(init=False)
    #: The limit of the job this one runs inside in the same thread (``drain()`` in a job):
    #: still counted by the watchdog, and this thread's limit again once this one ends.
    outer: ThreadLimit | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.hard_deadline = self.deadline - self.seconds + hard_limit(self.seconds)

    @property
    def hard_seconds(self) -> float:
        """Seconds after its start at which the watchdog kills (its message says them)."""
        return hard_limit(self.seconds)


class _HardLimit:
    """Only a hard limit (the watchdog's): the main thread's job's (under SIGALRM), kept
    apart from :data:`_limits` (no key, no dict entry per job of a worker running one at a
    time), and a :class:`watched` async job's (no thread to raise a timeout into).

    ``slack``: how much earlier an armed deadline may be and still be kept for this one
    (:meth:`Watchdog.start`). Only the main thread's job has any: SIGALRM ends its process
    at ``timeout + GRACE`` anyway. An async job is given up at that time and the worker goes
    on, as an executor thread's job is: the watchdog keeps its whole margin after that."""

    __slots__ = ("hard_deadline", "hard_seconds", "label", "outer", "slack")
    abandoned = False

    def __init__(self, hard_deadline: float, hard_seconds: float, label: str, *,
                 slack: float = 0.0) -> None:
        self.hard_deadline, self.hard_seconds, self.label = hard_deadline, hard_seconds, label
        self.slack = slack
        #: The main thread's limit this one runs inside (``drain()`` in a job), still counted.
        self.outer: _HardLimit | None = None


_limits: dict[int, ThreadLimit | _HardLimit] = {}
_keys = itertools.count(1)
_limits_lock = threading.Lock()
_local = threading.local()
#: The main thread's job's hard limit (see :class:`time_limit`), if it has one.
_main_limit: _HardLimit | None = None
_armed: ThreadLimit | _HardLimit | None = None  # the limit the watchdog is armed for


def _limits_not_inherited() -> None:
    """A forked child (a job that forks) runs no job of its parent's: their hard limits are
    not its own (its watchdog is a new one, :mod:`.watchdog`), and the lock may have been
    held by another thread of the parent as it forked."""
    global _main_limit, _armed, _limits_lock
    _limits.clear()
    _main_limit = _armed = None
    _limits_lock = threading.Lock()


os.register_at_fork(after_in_child=_limits_not_inherited)


def _enter_main(limit: _HardLimit) -> _HardLimit | None:
    """The main thread's job starts under ``limit``; returns the one it runs inside (a job
    run by ``drain()`` in a job), which the watchdog still counts."""
    global _main_limit
    with _limits_lock:
        outer, _main_limit = _main_limit, limit
        limit.outer = outer
        _rearm()
    return outer


def _exit_main(outer: _HardLimit | None) -> None:
    """The main thread's job ended; ``outer`` is its limit again (see :func:`_enter_main`)."""
    global _main_limit
    with _limits_lock:
        _main_limit = outer
        _rearm()


def enforce_in_this_thread() -> None:
    """Jobs run in this thread (an executor thread) get their time limits enforced."""
    _local.enforced = True


def abandon(limit: ThreadLimit) -> None:
    """The executor gave this job up: the watchdog no longer counts on it ending."""
    with _limits_lock:
        # Every limit of its thread: the jobs it ran inside, and any job run inside it.
        for given_up in _chain(_limits.get(limit.thread_id)) or [limit]:
            given_up.abandoned = True
        limit.abandoned = True
        _rearm()


def _rearm() -> None:
    """Arm the watchdog for the earliest hard limit of the running jobs (the main thread's
    and those in :data:`_limits`), or disarm it when there is none (under ``_limits_lock``)."""
    main = _main_limit
    if not _limits and (main is None or main.outer is None):
        _arm(main)  # the main thread's job alone (a solo worker's), or none: nothing to compare
        return
    earliest: ThreadLimit | _HardLimit | None = None
    while main is not None:  # the main thread's job, and those it runs inside
        if earliest is None or main.hard_deadline < earliest.hard_deadline:
            earliest = main
        main = main.outer
    for registered in _limits.values():
        limit: ThreadLimit | _HardLimit | None = registered
        while limit is not None:  # a thread's job, and those it runs inside
            if not limit.abandoned and (earliest is None
                                        or limit.hard_deadline < earliest.hard_deadline):
                earliest = limit
            limit = limit.outer
    _arm(earliest)


def _arm(limit: ThreadLimit | _HardLimit | None) -> None:
    """Arm the watchdog for ``limit``, or disarm it for ``None`` (under ``_limits_lock``):
    :meth:`Watchdog.start` and :meth:`Watchdog.ended`, which keep the armed deadline when
    the next limit's is at most its ``slack`` later (the main thread's jobs of one timeout,
    started one after the other, rewrite only their label; not for an executor thread's job
    or an async one, given up at their grace period while the worker
    goes on: the watchdog keeps its whole margin after that)."""
    global _armed
    if limit is _armed:
        return
    dog = watchdog.for_this_process()
    if limit is None:
        dog.ended()
    else:  # (a thread's or the loop's job keeps the whole margin: it is given up first)
        dog.start(limit.hard_deadline, limit.hard_seconds, limit.label,
                  slack=limit.slack if isinstance(limit, _HardLimit) else 0.0)
    _armed = limit


@contextmanager
def _thread_limit(seconds: float, finished: Callable[[], bool],
                  label: str) -> Iterator[None]:
    ident = threading.get_ident()
    limit = ThreadLimit(ident, seconds, time.monotonic() + seconds, finished, label)
    with _limits_lock:
        outer = _limits.get(ident)  # a job this one runs inside (drain() in a job)
        if isinstance(outer, ThreadLimit):
            limit.outer = outer
            limit.abandoned = outer.abandoned  # a given-up thread's jobs are not counted
        _limits[ident] = limit
        _rearm()
    try:
        yield
    finally:
        with _limits_lock:
            if _in_chain(limit, _limits.get(ident)):
                # Its outer one is the thread's limit again; with it go the limits of jobs
                # run inside it whose own clean-up a timeout cut short (they ended).
                if limit.outer is not None:
                    _limits[ident] = limit.outer
                else:
                    del _limits[ident]
                _rearm()


def _chain(limit: ThreadLimit | _HardLimit | None) -> list[ThreadLimit]:
    """A thread's limit and those of the jobs it runs inside, innermost first."""
    chain = []
    while isinstance(limit, ThreadLimit):
        chain.append(limit)
        limit = limit.outer
    return chain


def forget_thread_limit() -> None:
    """Drop this thread's limit, if one was left behind (a timeout raised just as the job
    left its limit cuts the clean-up of :func:`_thread_limit` short)."""
    with _limits_lock:
        if _limits.pop(threading.get_ident(), None) is not None:
            _rearm()


def thread_limit(thread_id: int) -> ThreadLimit | None:
    """The limit of the job running in the thread ``thread_id`` now, if it has one."""
    with _limits_lock:
        limit = _limits.get(thread_id)
    return limit if isinstance(limit, ThreadLimit) else None


def _in_chain(limit: ThreadLimit, head: ThreadLimit | _HardLimit | None) -> bool:
    """Whether ``limit`` itself is in the chain from ``head`` (by identity: two limits'
    fields may compare equal)."""
    return any(held is limit for held in _chain(head))


def thread_limits(thread_id: int) -> list[ThreadLimit]:
    """The limits of the thread ``thread_id``: its job's, and those of the jobs it runs
    inside (``drain()`` in a job), innermost first; each is enforced."""
    with _limits_lock:
        return _chain(_limits.get(thread_id))


def overdue_threads(thread_ids: Container[int], now: float | None = None) -> list[ThreadLimit]:
    """The limits of ``thread_ids`` whose time is up and whose timeout was not raised yet
    (an outer job's too, while a job it runs inside runs)."""
    now = time.monotonic() if now is None else now
    with _limits_lock:
        return [limit for ident, head in _limits.items() if ident in thread_ids
                for limit in _chain(head) if not limit.raised and limit.deadline <= now]


class ThreadTimeoutError(JobTimeoutError):
    """:class:`JobTimeoutError` as raised into a worker thread (an exception raised into
    another thread is given as a class, so its message is built where it lands)."""

    def __init__(self, *args: Any) -> None:
        if not args:
            # Without _limits_lock: this is made in the thread it was raised into, which may
            # hold the lock then (leaving its limit), and the lock is not reentrant.
            limit = _limits.get(threading.get_ident())
            seconds = (f" after {limit.seconds:g} s" if isinstance(limit, ThreadLimit)
                       else "")
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
        # Under the lock its thread takes to leave the limit, so the timeout cannot land
        # after the job has left it (between this check and the raise).
        with _limits_lock:
            if not _in_chain(limit, _limits.get(limit.thread_id)):
                continue
            limit.raised = True
            expired.append(limit)
            if limit.finished():
                logger.warning("%s: its time ran out after handle() finished; letting its "
                               "middleware finish.", limit.label)
                continue
            raise_in_thread(limit.thread_id, ThreadTimeoutError)
        logger.warning("%s has run past its timeout of %g s; raised the timeout in its "
                       "thread.", limit.label, limit.seconds)
    return expired
