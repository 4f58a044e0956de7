"""Batched completion: finished jobs acknowledged in groups, one statement per group.

A worker with ``JOBGUARD["COMPLETION_WINDOW"]`` above 0 (PostgreSQL) stops paying one ack
transaction per job. Its :class:`Completer` holds two kinds of rows, and one statement
(:meth:`~django_jobguard.dialects.base.Dialect.complete`) writes both:

- **finished** rows (``handle()`` returned): deleted in the group, owner-checked like one ack;
  after the commit each is released from its unique lock, ``job_processed`` is sent and its
  DONE line is logged, in that order, exactly as after a single ack — never before;
- **started** rows whose attempt has not been written (a *deferred start*): counted in the
  first group written once they have run for a window, unless they finished first (then the
  row is simply gone). A row still younger than the window stays deferred: with threads or
  async jobs, many rows wait for a thread or the loop at every group, and writing their
  starts would send each of them down the per-job path for its ack.

A group is written when ``COMPLETION_BATCH_SIZE`` rows finished, ``COMPLETION_WINDOW``
seconds after its oldest entry (a timer thread, so a long job does not hold back the acks
of those before it), when the worker goes idle, and when it stops.

**Which rows are grouped.** Only a row whose start was deferred: a row claimed ahead (its
attempt not counted by the claim), not *recovered* (its previous worker did not vanish
holding it), claimed less than half a lease (``RETRY_AFTER``) ago (a row held longer, as
after a stall, may have been taken over: its start is written, owner-checked), of a job
class whose last run in this process took less than the window. Its
start and its end then meet in one group, or its start is written within two windows (the
first group after it ran for one) and the row is acked on its own. Everything else (the
first run of each class, slow classes, kept results, chains and batches, releases and
failures) takes the per-job path, as without the completer, after taking the row's start
back from the group (:meth:`Completer.take_start`).

**What a crash costs** (``kill -9``, OOM): the rows finished in the last window run again,
and so do the rows that started in the last two. Neither had an attempt written, so the
re-run uses none: a finished run's repetition never spends a try or fails a job
(``tries=1`` included). A recovered row always starts with its attempt written, so a job
that kills its worker within the window is counted from its second run on and ends by its
``tries`` as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, InterfaceError, connections

from django_jobguard import clock, queue
from django_jobguard.conf import jobguard_settings
from django_jobguard.dialects import dialect_for

if TYPE_CHECKING:
    from django_jobguard.context import JobLike
    from django_jobguard.dialects.base import Dialect
    from django_jobguard.models import QueuedJob
    from django_jobguard.outcome import Outcome

logger = logging.getLogger("django_jobguard.worker")

#: What :meth:`Pipeline.process` returns for a row whose ack joined the group: not a state
#: yet (nothing counts it); the group logs DONE (or LOST) once written.
GROUPED = "GROUPED"


@dataclass(slots=True)
class Finished:
    """A row whose ``handle()`` returned, waiting for its group; ``acked`` is what its
    pipeline does once the group committed (``lost``: when the row was no longer its)."""

    row: QueuedJob
    job: JobLike
    outcome: Outcome
    elapsed: float
    acked: Callable[[Finished], None]
    lost: Callable[[Finished], None]


#: Seconds :meth:`Completer.take_start` waits at most for a group statement writing the
#: row's start (one that takes longer has met a database its own write would wait for too).
_FLIGHT_WAIT = 60.0


class _Flight:
    """One group statement writing deferred starts, and the thread writing it."""

    __slots__ = ("writer",)

    def __init__(self) -> None:
        self.writer = threading.get_ident()


class Completer:
    """The completion group of one worker (shared by its threads and its event loop)."""

    def __init__(self, *, worker_id: str, using: str, window: float, batch_size: int,
                 dialect: Dialect | None = None) -> None:
        """``dialect`` writes the groups (default: ``using``'s; a test's or a benchmark's
        stand-in writes none)."""
        self.worker_id = worker_id
        self.using = using
        self.window = window
        self.batch_size = max(1, batch_size)
        self._dialect = dialect if dialect is not None else dialect_for(using)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: Where :meth:`take_start` waits for a group statement (apart from the timer's).
        self._landing = threading.Condition(self._lock)
        self._finished: list[Finished] = []
        #: Deferred starts (running, attempt not written): each row and when it started.
        self._starts: dict[Any, tuple[QueuedJob, float]] = {}
        #: The deferred starts a group statement writes now, by id, each with that
        #: statement's :class:`_Flight` (:meth:`take_start` waits for it: only its result
        #: says whether the attempt is written).
        self._in_flight: dict[Any, _Flight] = {}
        self._since: float | None = None  # when the oldest entry came
        self._runtimes: dict[str, float] = {}  # a class's last run here, in seconds
        self._closed = False
        #: Set when a group filled up where it could not be written (the event loop): the
        #: timer thread writes it at once.
        self._urgent = False
        #: Set while the timer thread writes a group (a full one found meanwhile is written
        #: by the thread that filled it: at most two groups in flight).
        self._writing = False
        self._timer: threading.Thread | None = None

    @staticmethod
    def wanted(using: str) -> bool:
        """Whether a worker on ``using`` groups its completions: the setting is on, the
        dialect tells recovered rows apart, and the worker does not run inside a transaction
        (a test's, or one around an embedded worker: rows it has not committed are invisible
        to the timer thread's connection, and its acks would not be its own commits)."""
        return (float(jobguard_settings.COMPLETION_WINDOW or 0) > 0
                and dialect_for(using).marks_recovered
                and not connections[using].in_atomic_block)

    # -- starts ----------------------------------------------------------------------------

    def defers(self, row: QueuedJob) -> bool:
        """Whether ``row``'s start may wait for its group (see the module docstring)."""
        return (queue.claimed_ahead(row) and getattr(row, "recovered", None) is False
                and not queue.poison(row)
                and self._runtimes.get(row.name, self.window) < self.window
                and self._surely_held(row))

    @staticmethod
    def _surely_held(row: QueuedJob) -> bool:
        """Whether ``row``'s lease from its claim has at least half its length left: a row
        the worker held longer (a stall, a long wait in a buffer) may have been taken over
        meanwhile, so its start is written now, owner-checked, and a row another worker
        took is LOST here, not run beside its new owner. (Its deferred start has no
        statement of its own to find that out.)"""
        held_until = getattr(row, "held_until", None)
        return held_until is not None and (
            held_until - clock.lease_clock() > float(jobguard_settings.RETRY_AFTER) / 2)

    def start(self, row: QueuedJob) -> bool:
        """Start ``row``: deferred to its group when :meth:`defers`, else written now with
        the group (one round trip). False if the worker no longer holds it."""
        if self.defer(row) or not queue.claimed_ahead(row):
            return True
        return self.flush(start=row)

    def defer(self, row: QueuedJob) -> bool:
        """Defer ``row``'s start to its group if :meth:`defers`, without a statement (what
        the event loop may do); False, nothing done, otherwise."""
        if not self.defers(row):
            return False
        queue.counted(row)  # the job sees its attempt; the database learns it in the group
        with self._wake:
            self._starts[row.id] = (row, time.monotonic())
            self._entered()
        return True

    def take_start(self, row: QueuedJob) -> None:
        """Before a per-job write of ``row``: take its deferred start out of the group, and
        mark the attempt not written (``queue.release`` then counts it in its own update)."""
        with self._landing:
            if self._starts.pop(row.id, None) is not None:
                row.attempt_counted = False
                return
            # Its start may be in a group statement now: if the row's own write committed
            # first, that statement would miss it, and its attempt would be counted nowhere
            # (or a deferral would give back one never taken). The group's result decides.
            # (Not in the thread writing it: a signal handler that interrupted its write.
            # Bounded: a statement that never ends leaves the attempt to the row's write.)
            me, until = threading.get_ident(), time.monotonic() + _FLIGHT_WAIT
            while (flight := self._in_flight.get(row.id)) is not None and flight.writer != me:
                left = until - time.monotonic()
                if left <= 0:
                    logger.warning("The group writing the start of %s did not end in %g s; "
                                   "its own write goes on.", row, _FLIGHT_WAIT)
                    return
                self._landing.wait(left)

    def ran(self, name: str, seconds: float) -> None:
        """A job of class ``name`` ran ``seconds`` (the next one's start may be deferred)."""
        self._runtimes[name] = seconds

    # -- ends ------------------------------------------------------------------------------

    def groups(self, row: QueuedJob) -> bool:
        """Whether ``row``'s ack may join the group: its start was deferred and not written."""
        with self._lock:
            return row.id in self._starts

    def join(self, entry: Finished, *, write: bool = True) -> bool:
        """``entry`` finished: its ack joins the group if it may (:meth:`groups`, asked under
        the same lock); False, nothing done, otherwise. A full group is written at once by
        the timer thread, woken for it, so that the job's thread goes on to its next job
        while the statement runs; by this thread only when the timer thread is still writing
        the group before (at most two groups in flight) and ``write`` (not on the event
        loop)."""
        with self._wake:
            if self._starts.pop(entry.row.id, None) is None:
                return False
            full = self._append(entry, write)
        if full:  # the timer thread is writing the group before: this one is written here
            self.flush()
        return True

    def _append(self, entry: Finished, write: bool) -> bool:
        """Under the lock: ``entry`` joins the group; whether the caller writes the group
        now (full while the timer thread writes the one before; see :meth:`join`)."""
        self._finished.append(entry)
        self._entered()
        if len(self._finished) < self.batch_size:
            return False
        if not write or not self._writing:
            self._urgent = True
            self._wake.notify()
            return False
        return True

    def held(self) -> set[Any]:
        """Ids of the finished rows waiting for their group (the heartbeat renews them)."""
        with self._lock:
            return {entry.row.id for entry in self._finished}

    # -- the group ---------------------------------------------------------------------------

    def flush(self, *, start: QueuedJob | None = None, every_start: bool = False) -> bool:
        """Write the group (and ``start``'s attempt, a row starting now) in one statement,
        then finish its acked rows; returns whether ``start`` was still held. The deferred
        starts younger than the window wait for a later group, unless ``every_start``."""
        flight, starts = _Flight(), []
        try:
            with self._lock:
                finished, self._finished = self._finished, []
                starts = self._due_starts(every_start)
                self._in_flight.update((row.id, flight) for row in starts)
                self._urgent = False
            return self._write(finished, starts, start, flight)
        finally:
            self._landed(starts, flight)

    def _landed(self, starts: list[QueuedJob], flight: _Flight) -> None:
        """The group statement ``flight`` writing ``starts`` returned (or failed): whoever
        waits for one of them in :meth:`take_start` goes on (again once the group is done:
        an id written by a later group by then is that group's)."""
        if starts:
            with self._landing:
                for row in starts:
                    if self._in_flight.get(row.id) is flight:
                        del self._in_flight[row.id]
                self._landing.notify_all()

    def _write(self, finished: list[Finished], deferred: list[QueuedJob],
               start: QueuedJob | None, flight: _Flight) -> bool:
        """:meth:`flush`'s statement and what follows it (``deferred``: the deferred starts
        taken out for it, in ``flight``; ``start``: a row starting now)."""
        starts = deferred if start is None else [*deferred, start]
        if not finished and not starts:
            return True
        try:
            acked, started = self._dialect.complete(
                [(e.row.id, e.row.claims) for e in finished],
                [(row.id, row.claims) for row in starts], self.worker_id,
                relaxed=not jobguard_settings.SYNCHRONOUS_ACKS)
        except BaseException as exc:
            for row in deferred:  # not written: a deferred start is counted by its row's
                row.attempt_counted = False  # own write (a release, a failure), as after
            self._landed(deferred, flight)  # take_start()
            if not isinstance(exc, (DatabaseError, InterfaceError)):
                raise
            logger.error("Could not write a completion group of %s finished jobs (%s); their "
                         "leases will run out and they will run again, without using a try.",
                         len(finished), exc)
            queue.close_broken_connections()
            if start is not None:
                raise
            return False
        for row in starts:
            if row.id in started:
                row.attempt_counted = True
        self._landed(deferred, flight)  # (before the acked rows' own work: take_start())
        if start is not None and start.id in started:
            queue.counted(start)
        for entry in finished:
            # (A release that meets a cut connection reconnects and tries again itself:
            # unique_jobs.release; the later releases of the group find a fresh one.)
            try:
                (entry.acked if entry.row.id in acked else entry.lost)(entry)
            except Exception:
                logger.exception("Error while finishing %s after its group was written.",
                                 entry.row)
        return start is None or start.id in started

    def _due_starts(self, every: bool) -> list[QueuedJob]:
        """Under the lock: take out the deferred starts to write now (those that ran for a
        window, or all), and time the next group from the oldest one left."""
        if every:
            due = [row for row, _ in self._starts.values()]
            self._starts.clear()
            self._since = None
            return due
        ripe = time.monotonic() - self.window
        due = [row for row, started in self._starts.values() if started <= ripe]
        for row in due:
            del self._starts[row.id]
        self._since = min((started for _, started in self._starts.values()), default=None)
        return due

    def _entered(self) -> None:
        """Under the lock: an entry came; the timer writes the group at most ``window``
        after the oldest."""
        if self._since is None:
            self._since = time.monotonic()
            if self._timer is None:
                self._timer = threading.Thread(target=self._run_timer, daemon=True,
                                               name=f"jobguard-completer-{self.worker_id}")
                self._timer.start()
            self._wake.notify()

    def _run_timer(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._closed and self._since is None:
                        self._wake.wait()
                    if self._closed:
                        return
                    since = self._since
                    assert since is not None  # the loop above waited for an entry
                    due = since + self.window - time.monotonic()
                    if due > 0 and not self._urgent:
                        self._wake.wait(due)
                        continue
                    self._writing = True
                try:
                    self.flush()
                except Exception:
                    logger.exception("The completion timer could not write a group.")
                finally:
                    with self._wake:
                        self._writing = False
        finally:
            connections.close_all()

    def close(self) -> None:
        """Write what is left and stop the timer (the worker is stopping)."""
        try:
            self.flush(every_start=True)
        finally:
            with self._wake:
                self._closed = True
                self._wake.notify_all()
            if self._timer is not None:
                self._timer.join(timeout=5)
