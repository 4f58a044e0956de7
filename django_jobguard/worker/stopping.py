"""Graceful stops: what ``job.stopping`` reads, and ``jobworker --stop-timeout``.

A worker stops gracefully on SIGTERM / a first SIGINT, when ``--max-time`` has passed, for a
reload, or when an operator stops it; from then on ``job.stopping`` is true in its running
jobs, so a long job can stop between two steps and go back to the queue with
``self.interrupt()`` (an iterable job does it by itself). A worker an operator quieted stays
up, but its running jobs see ``job.stopping`` too: quiet is a graceful stop for them, without
``--stop-timeout``. With ``--stop-timeout S`` a job still running S seconds after the graceful stop
began is interrupted (:class:`~django_jobguard.exceptions.StopTimeoutError` raised in it, as
a second Ctrl-C does) and goes back to the queue without using an attempt: set S below the
time your platform waits before SIGKILL (Kubernetes: ``terminationGracePeriodSeconds``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django_jobguard.exceptions import StopTimeoutError

logger = logging.getLogger("django_jobguard.worker")

#: Sent by the worker to itself to interrupt the job running in its main thread.
INTERRUPT = signal.SIGUSR2


class _StopTimeoutInThread(StopTimeoutError):
    """:class:`StopTimeoutError` as raised into a thread (given as a class)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(args or (self.detail,)))


class GracefulStop:
    """When a worker is stopping gracefully, and ``--stop-timeout`` enforced after it.

    It knows its worker only through what it is given: the worker's ``stop`` flag (set: stop
    claiming) and ``halted`` event (set: the worker has ended), ``--max-time`` and
    ``--stop-timeout``, and two callbacks: ``interrupt_running(error_class)`` interrupts the
    jobs running on threads and the event loop and says whether a job runs in the main
    thread, which ``interrupt_here(error)`` (a signal handler) then raises into."""

    def __init__(self, *, worker_id: str, stop: threading.Event, halted: threading.Event,
                 max_time: float, stop_timeout: float | None,
                 interrupt_running: Callable[[type[StopTimeoutError]], bool],
                 interrupt_here: Callable[[StopTimeoutError], None],
                 quiet: threading.Event | None = None) -> None:
        self.worker_id, self.stop, self.halted = worker_id, stop, halted
        self.quiet = quiet or threading.Event()
        self.max_time, self.stop_timeout = max_time, stop_timeout
        self._interrupt_running, self._interrupt_here = interrupt_running, interrupt_here
        self.started: float | None = None
        self.began_at: float | None = None  # monotonic time the graceful stop was seen

    def stopping(self) -> bool:
        """Whether the worker is stopping: a stop was asked for, ``--max-time`` passed, or
        an operator quieted it (its running jobs may hand themselves back: ``interrupt()``)."""
        return self.quiet.is_set() or self.stop_asked()

    def stop_asked(self) -> bool:
        """Whether the worker is to exit: a stop was asked for, or ``--max-time`` passed (a
        quiet worker stays up, and ``--stop-timeout`` does not cut its jobs off)."""
        if self.stop.is_set():
            return True
        max_time = self.max_time
        return bool(max_time and self.started is not None
                    and time.monotonic() - self.started >= max_time)

    def begin(self) -> None:
        """The worker starts running: from now ``--max-time`` counts, and ``--stop-timeout``
        (when set) is watched by a thread of its own."""
        self.started = time.monotonic()
        timeout = self.stop_timeout
        if not timeout:
            return
        if threading.current_thread() is threading.main_thread():
            signal.signal(INTERRUPT, self._on_interrupt)
        threading.Thread(target=self._watch, args=(timeout,), daemon=True,
                         name="jobguard-stop-timeout").start()

    def _watch(self, timeout: float) -> None:
        halted = self.halted
        while not self.stop_asked():
            if halted.wait(0.2):
                return
        self.stop.set()  # --max-time passed in a job: stop claiming as well
        self.began_at = time.monotonic()
        if halted.wait(timeout):
            return
        self.interrupt_running(timeout)

    def interrupt_running(self, timeout: float) -> None:
        """Interrupt every job still running: each goes back to the queue, attempt unused."""
        logger.warning("Worker %s: jobs still running %g s after a graceful stop began "
                       "(--stop-timeout); they go back to the queue without using an "
                       "attempt.", self.worker_id, timeout)
        if self._interrupt_running(_StopTimeoutInThread):  # a job in the main thread
            os.kill(os.getpid(), INTERRUPT)  # raised in the main thread by _on_interrupt

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        self._interrupt_here(StopTimeoutError(StopTimeoutError.detail))
