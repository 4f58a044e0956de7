"""A running job's progress and cancellation, as its :class:`JobContext` reports and asks them:
``self.progress(0.4, "page 4 of 10")`` writes at most once a second (the latest value is
written when the second is up, by a timer), and ``self.cancelled`` reads the row at most once
a second and stays true once it was."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections

from django_jobguard import queue

logger = logging.getLogger("django_jobguard.worker")

#: Seconds between two writes of a job's progress, and between two reads of its cancel flag.
INTERVAL = 1.0


def _in_event_loop() -> bool:
    """Whether this thread runs an event loop (an async job: no sync database call here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def check_fraction(fraction: float) -> float:
    """``fraction`` as a float from 0 to 1, or ``ValueError`` saying what it was."""
    try:
        value = float(fraction)
    except (TypeError, ValueError):
        raise ValueError(f"progress must be a number from 0 to 1, not {fraction!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"progress must be from 0 to 1, not {value:g}")
    return value


def stored_fraction(value: Any) -> float | None:
    """A stored progress as operators see it: ``None`` when there is none, or when the
    stored value is not a number from 0 to 1 (NaN, infinity: bad data written around
    :func:`check_fraction`), so a read never fails on it."""
    try:
        return check_fraction(value) if value is not None else None
    except ValueError:
        return None


class RunReporter:
    """Progress writes and cancel reads of one run of one job (``job_id`` held by
    ``worker_id`` in ``using``, under its claim number ``claims`` when given), throttled to one
    database round trip a second each."""

    # Until a run reports or asks (most never do), its reporter holds these class values:
    # one is made for every run, so it sets only what differs.
    _written_at = -INTERVAL
    _pending: tuple[float, str] | None = None
    _timer: threading.Timer | None = None
    _checked_at = -INTERVAL
    _cancelled = False
    #: Progress writes made.
    writes = 0

    def __init__(self, job_id: str, *, worker_id: str, using: str, claims: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id, self.worker_id, self.using, self.claims = job_id, worker_id, using, claims
        self._clock = clock
        self._lock = threading.Lock()

    def progress(self, fraction: float, message: str = "") -> None:
        """Report ``fraction`` (0 to 1) and ``message``; written now or within a second."""
        value = (check_fraction(fraction), str(message))
        with self._lock:
            self._pending = value
            wait = self._written_at + INTERVAL - self._clock()
            if wait > 0 or _in_event_loop():  # an async job: never write on the loop
                wait = max(wait, 0.0)
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._flush_from_timer)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.flush()

    def flush(self) -> None:
        """Write the pending progress, if any."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return
            self._written_at = self._clock()
        try:
            queue.write_progress(self.job_id, *pending, worker_id=self.worker_id,
                                 claims=self.claims, using=self.using)
            self.writes += 1
        except DatabaseError as exc:  # progress is advice: never fail the job for it
            logger.warning("Could not store the progress of %s (%s).", self.job_id, exc)

    def _flush_from_timer(self) -> None:
        with self._lock:
            self._timer = None
        try:
            self.flush()
        finally:
            connections.close_all()  # the timer thread's own connection

    def cancelled(self) -> bool:
        """Whether an operator asked this run to stop (read at most once a second)."""
        if self._cancelled or _in_event_loop():  # an async job: its run reads the flag
            return self._cancelled
        now = self._clock()
        if now - self._checked_at >= INTERVAL:
            self._checked_at = now
            try:
                self._cancelled = queue.cancel_requested(self.job_id, using=self.using)
            except DatabaseError as exc:
                logger.warning("Could not read the cancel flag of %s (%s).", self.job_id, exc)
        return self._cancelled

    def close(self) -> None:
        """Stop the pending timer (the run ended; its row is about to go)."""
        if self._timer is None and self._pending is None:  # (most runs report nothing)
            return
        with self._lock:
            timer, self._timer, self._pending = self._timer, None, None
        if timer is not None:
            timer.cancel()

    def __repr__(self) -> str:
        return f"<RunReporter {self.job_id}>"


