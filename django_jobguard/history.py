"""Per-queue, per-minute counts of finished and failed jobs: what the dashboard's history
charts read, kept in the database so that they survive workers coming and going.

Each worker counts the outcomes of its jobs per queue in memory (:class:`QueueCounter`, fed
where the worker feeds its last-minute counts) and adds them, at each heartbeat, to the
:class:`~django_jobguard.models.QueueMinute` row of the current minute by the database clock,
in one ``INSERT ... ON CONFLICT DO UPDATE`` (``ON DUPLICATE KEY UPDATE`` on MySQL/MariaDB;
the statement is the dialect's, ``Dialect.add_queue_counts``) that adds to what other
workers wrote: no read-modify-write, so no lost update between
workers. A job is counted in the minute of the heartbeat after it ended (at most one
heartbeat interval, ``RETRY_AFTER / 3`` capped at 15 s, late). Housekeeping deletes rows
older than :data:`KEEP`.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Mapping

from django.db.models import Value

from django_jobguard import clock
from django_jobguard.conf import queue_database
from django_jobguard.dialects import dialect_for
from django_jobguard.models import QueueMinute
from django_jobguard.outcome import JobState

#: How long minute rows are kept: the 24 h chart plus a day of slack.
KEEP = datetime.timedelta(days=2)

#: Outcomes counted as done (``JobState.finished()``, as the worker's ``RecentOutcomes``).
DONE_STATES = JobState.finished()
FAILED_STATE = JobState.FAILED


class QueueCounter:
    """A worker's done and failed jobs per queue since its last :meth:`flush` (thread-safe:
    ``--concurrency`` threads and the heartbeat thread share it)."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def record(self, queue: str, state: str) -> None:
        """Count one outcome of a job of ``queue`` (releases and the like are not counted)."""
        failed = state == FAILED_STATE
        if not failed and state not in DONE_STATES:
            return
        with self._lock:
            self._counts.setdefault(queue, [0, 0])[1 if failed else 0] += 1

    def pending(self) -> dict[str, tuple[int, int]]:
        """``{queue: (done, failed)}`` not written yet."""
        with self._lock:
            return {queue: (c[0], c[1]) for queue, c in self._counts.items()}

    def flush(self, using: str | None = None) -> int:
        """Add the counts to the current minute's rows; returns how many rows were written.
        If the write fails the counts are kept for the next flush (and the error raised)."""
        with self._lock:
            taken, self._counts = self._counts, {}
        if not taken:
            return 0
        try:
            return add_counts({q: (c[0], c[1]) for q, c in taken.items()}, using=using)
        except BaseException:
            with self._lock:
                for queue, (done, failed) in taken.items():
                    counts = self._counts.setdefault(queue, [0, 0])
                    counts[0] += done
                    counts[1] += failed
            raise


def current_minute(using: str | None = None) -> datetime.datetime:
    """The database clock's current minute (seconds dropped), aware UTC."""
    now = dialect_for(queue_database(using)).now() + datetime.timedelta(seconds=clock.offset())
    return now.replace(second=0, microsecond=0)


def add_counts(counts: Mapping[str, tuple[int, int]], *, minute: datetime.datetime | None = None,
               using: str | None = None) -> int:
    """Add ``{queue: (done, failed)}`` to the rows of ``minute`` (default: now, database
    clock) in one atomic upsert statement; returns the number of queues written."""
    rows = [(queue, done, failed) for queue, (done, failed) in counts.items()
            if done or failed]
    if not rows:
        return 0
    using = queue_database(using)
    minute = minute or current_minute(using)
    # One order everywhere, so two workers' statements lock rows in the same order.
    dialect_for(using).add_queue_counts(minute, sorted(rows))
    return len(rows)


def prune(*, older_than: datetime.timedelta = KEEP, using: str | None = None) -> int:
    """Delete the minutes older than ``older_than`` (database clock); returns how many."""
    using = queue_database(using)
    old = QueueMinute.objects.using(using).filter(
        minute__lt=clock.db_now() - Value(older_than))
    return old._raw_delete(using)
