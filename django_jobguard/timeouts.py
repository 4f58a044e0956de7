"""A job's time limit inside the worker process (SIGALRM, main thread only), backed by the
watchdog process for jobs that no signal interrupts (:mod:`django_jobguard.watchdog`)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    if not seconds or threading.current_thread() is not threading.main_thread():
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
