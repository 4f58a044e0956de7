"""The local prefetch buffer of ``jobworker --threads N`` and of the async executor.

A worker with several slots (threads, or async jobs on the event loop) keeps a few rows
claimed ahead in a :class:`Prefetch` buffer, so that a slot that frees starts its next job at
once, in its own thread (or on the loop), instead of waiting for the coordinator to wake up,
claim and hand a row over. The coordinator refills the buffer with one claim when it runs
low. The rows in it are claimed ahead exactly as the solo executor's batch is
(:mod:`django_jobguard.worker.claiming`):

- their attempt is not counted until each starts (``queue.claimed_ahead(row)``; the
  pipeline's start writes it, or the completion group does), so a worker killed with rows in
  the buffer has used none of their tries: their lease runs out and another worker runs them;
- their leases are renewed by the heartbeat (:meth:`ids` is part of the worker's held set);
- they go back to the queue, attempt unused, when the worker stops, is quieted, or a queue of
  theirs is paused (:meth:`drain`, :meth:`take_queues`).

**How many.** :meth:`target` sizes the buffer from the recent average job duration, as the
solo executor's claim is sized: at most ``slots`` rows, and no more than
:data:`~django_jobguard.worker.claiming.AHEAD_SECONDS` of work per slot (``slots *
AHEAD_SECONDS / average``). A backlog of 50 ms jobs on 20 threads keeps 20 rows ready; jobs of
a second or more keep none (the buffer then only holds rows of a kind whose slots are full,
as before). Until a job has finished the target is 0.

**What is never prefetched.** A queue with a global concurrency cap or per-key fair-share
limits (their claimed rows count against the limit: a buffered row would hold a place an
idle worker could use), and none at all on a worker with ``--queue name:N`` numbers (its
per-queue numbers count the running jobs only). Middleware guards (unique locks,
``WithoutOverlapping``, rate limits) apply when a row starts, so a buffered row meets them as
any other does.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django_jobguard.worker.claiming import AHEAD_SECONDS

if TYPE_CHECKING:
    from django_jobguard.models import QueuedJob

#: Weight of the newest job in the running average of job durations.
_SMOOTHING = 0.2


class Prefetch:
    """Claimed rows that no slot has started yet (any thread may take one).

    ``is_async(row)`` tells which kind of slot a row needs (an async job runs on the event
    loop, a sync one on a thread)."""

    def __init__(self, is_async: Callable[[QueuedJob], bool], *,
                 ahead_seconds: float = AHEAD_SECONDS) -> None:
        self._is_async = is_async
        self.ahead_seconds = ahead_seconds
        self._lock = threading.Lock()
        self._rows: deque[QueuedJob] = deque()
        self._closed = False
        self.average: float | None = None  # seconds per job, smoothed

    # -- the coordinator -------------------------------------------------------------------

    def put(self, rows: Iterable[QueuedJob]) -> list[QueuedJob]:
        """Add ``rows`` (claimed, not started); returns those refused because the buffer
        was closed meanwhile (the caller gives them back)."""
        with self._lock:
            if self._closed:
                return list(rows)
            self._rows.extend(rows)
            return []

    def target(self, slots: int, *, most: int | None = None) -> int:
        """How many rows to keep ready for ``slots`` slots (see the module docstring);
        ``most``: at most that many instead of one per slot (the solo worker's claim of
        async rows: fast jobs claimed by the batch, slow ones a few at a time)."""
        average = self.average
        cap = slots if most is None else most
        if not average or slots < 1:
            return 0
        if average <= 0:
            return cap
        return max(0, min(cap, int(slots * self.ahead_seconds / average)))

    def finished(self, seconds: float) -> None:
        """A job ran ``seconds`` (wall clock, start to outcome); any thread."""
        average = self.average
        self.average = seconds if average is None else average + _SMOOTHING * (
            seconds - average)

    def drain(self, *, close: bool = False) -> list[QueuedJob]:
        """Take every row out (to give them back); ``close``: refuse rows from now on (the
        worker stops or was quieted)."""
        with self._lock:
            rows = list(self._rows)
            self._rows.clear()
            self._closed = self._closed or close
            return rows

    def take_queues(self, names: set[str]) -> list[QueuedJob]:
        """Take out the rows of the queues ``names`` (paused meanwhile: given back)."""
        with self._lock:
            taken = [row for row in self._rows if row.queue in names]
            if taken:
                self._rows = deque(row for row in self._rows if row.queue not in names)
            return taken

    # -- the slots ---------------------------------------------------------------------------

    def take(self, *, is_async: bool) -> QueuedJob | None:
        """The oldest row of the kind, taken out; ``None`` when there is none (or the buffer
        is closed)."""
        with self._lock:
            if self._closed:
                return None
            for index, row in enumerate(self._rows):
                if self._is_async(row) == is_async:
                    del self._rows[index]
                    return row
            return None

    # -- what the heartbeat and the loop read --------------------------------------------------

    def ids(self) -> set[Any]:
        """Ids of the rows held here (the heartbeat renews their leases)."""
        with self._lock:
            return {row.id for row in self._rows}

    def queues(self) -> set[str]:
        """The queues of the rows held here."""
        with self._lock:
            return {row.queue for row in self._rows}

    def count(self, *, is_async: bool) -> int:
        """How many rows of the kind are held."""
        with self._lock:
            return sum(1 for row in self._rows if self._is_async(row) == is_async)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def closed(self) -> bool:
        return self._closed
