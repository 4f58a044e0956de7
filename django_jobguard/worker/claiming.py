"""How many jobs a worker asks for per claim: one without a backlog, several with one.

:class:`ClaimSize` is the worker's adaptive claim. A claim that came back full says there is a
backlog, and the next asks for twice as many, up to :data:`MAX_CLAIM`; one that came back
short goes back to one. The size is also capped so that the jobs claimed ahead are worth
about :data:`AHEAD_SECONDS` of work at the recent average job duration: a backlog of
millisecond jobs is claimed up to 512 at a time (one round trip instead of 512), a backlog
of one-second jobs one at a time (no worker sits on jobs an idle one could run). Rows claimed
ahead keep their lease renewed by the heartbeat, count their attempt only when they start,
and are given back on shutdown.

:class:`ClaimAhead` makes the solo worker's next claim on a thread of its own while a
backlog's batch runs, so that the worker does not wait for the claim's round trip between
batches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from django_jobguard import queue

logger = logging.getLogger("django_jobguard.worker")

#: The most rows one adaptive claim asks for.
MAX_CLAIM = 512
#: Work (in seconds, at the recent average duration) a worker may hold claimed ahead.
AHEAD_SECONDS = 0.05
#: Weight of the newest job in the running average of job durations.
_SMOOTHING = 0.2


class ClaimSize:
    """The size of the next claim (``fixed`` sizes, from ``--batch`` or
    ``CLAIM_BATCH_SIZE``, never change)."""

    def __init__(self, fixed: int | None = None, *, most: int = MAX_CLAIM,
                 ahead_seconds: float | None = None) -> None:
        self.fixed = fixed
        self.most = most
        self.ahead_seconds = AHEAD_SECONDS if ahead_seconds is None else ahead_seconds
        self.average: float | None = None  # seconds per job, smoothed
        self._next = 1

    def next(self) -> int:
        """How many rows to ask for now."""
        if self.fixed:
            return self.fixed
        if self.average and self.average > 0:
            return max(1, min(self._next, int(self.ahead_seconds / self.average)))
        return self._next

    def fast(self, batch: int) -> bool:
        """Whether a batch of ``batch`` jobs ends within :data:`AHEAD_SECONDS` at the recent
        average (unknown before the first job ended): only then may the next batch be
        claimed while it runs (:class:`ClaimAhead`), held no longer than that."""
        return self.average is not None and self.average * batch <= self.ahead_seconds

    def claimed(self, asked: int, got: int) -> None:
        """Record a claim's result: full means a backlog, so ask for more next time."""
        self._next = min(self.most, max(1, asked * 2)) if got >= asked else 1

    def finished(self, seconds: float) -> None:
        """Record how long a job took (wall clock, claim to outcome)."""
        self.average = seconds if self.average is None else (
            self.average + _SMOOTHING * (seconds - self.average))


def _close_connections() -> None:
    """Close the claim thread's connections (Django's, and its own for claims)."""
    queue.close_claim_connections()
    connections.close_all()


class ClaimAhead:
    """The next claim of a solo worker draining a backlog, made on this class's thread (its
    own database connection) while the worker runs the batch before it.

    One claim at a time: :meth:`start` sends it, :meth:`take` waits for its rows. Its rows
    are held from the moment they come (:meth:`ids`: the heartbeat renews their leases) until
    taken; like every row claimed ahead, their attempts count only when each starts, and
    what is never taken goes back to the queue (:meth:`close`)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future[None] | None = None
        self._lock = threading.Lock()
        self._asked = 0
        self._rows: list[Any] | None = []  # None: the claim failed
        self._at = 0.0  # time.monotonic() of the claim

    @property
    def pending(self) -> bool:
        """Whether a claim was sent and its rows not taken yet."""
        return self._future is not None

    def start(self, asked: int, claim: Callable[[], list[Any]]) -> None:
        """Send ``claim()`` (which asks for ``asked`` rows) to the claim thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="jobguard-claim")
        self._future = self._pool.submit(self._run, asked, claim)

    def _run(self, asked: int, claim: Callable[[], list[Any]]) -> None:
        at = time.monotonic()
        rows: list[Any] | None
        try:
            rows = claim()
        except (DatabaseError, InterfaceError) as exc:  # the worker claims itself next
            logger.warning("Claim ahead failed (%s); the next claim is the worker's own.", exc)
            queue.close_broken_connections(all_idle=True)
            rows = None
        with self._lock:
            self._asked, self._rows, self._at = asked, rows, at

    def take(self) -> tuple[int, list[Any] | None, float]:
        """Wait for the claim sent: how many rows it asked for, the rows (the caller's now;
        ``None`` if the claim failed) and when it was made (``time.monotonic()``)."""
        future, self._future = self._future, None
        if future is None:
            return 0, [], time.monotonic()
        future.result()
        with self._lock:
            taken = self._asked, self._rows, self._at
            self._rows = []
        return taken

    def back(self) -> list[Any] | None:
        """The rows of the claim sent, without taking them, once it is back (``[]`` when
        none came); ``None`` when none was sent or it failed."""
        future = self._future
        if future is None:
            return None
        future.result()
        with self._lock:
            return None if self._rows is None else list(self._rows)

    def ids(self) -> set[Any]:
        """Ids of the rows claimed and not taken (from any thread)."""
        with self._lock:
            return {row.id for row in self._rows or ()}

    def close(self) -> list[Any]:
        """Wait for a claim still sent and stop the thread; the rows nobody took."""
        rows = self.take()[1] or []
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.submit(_close_connections).result()
            pool.shutdown()
        return rows
