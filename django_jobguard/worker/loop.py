"""The worker: claim jobs, hand each to an executor, keep leases and liveness fresh.

:class:`Worker` is the loop of ``manage.py jobworker`` (:meth:`Worker._loop`, read top to
bottom): claim due rows (:mod:`django_jobguard.queue`; which queue is
:class:`~django_jobguard.worker.queue_selection.QueueSelection`'s choice, ``--queue a:3,b:1``),
hand async ones to the :class:`~django_jobguard.worker.async_executor.AsyncExecutor` and sync
ones to the worker's :class:`~django_jobguard.worker.executor.Executor`, each of which runs
them through :class:`~django_jobguard.worker.pipeline.Pipeline`; check the stop conditions;
wait for a free slot, a NOTIFY (PostgreSQL), a due job or a poll. The
:class:`~django_jobguard.worker.heartbeat.Heartbeat` thread renews the leases of the rows the
worker holds and does the shared housekeeping.

There is one loop whatever the executor (as celery's ``solo`` pool is a pool): without
``--threads`` it is the :class:`~django_jobguard.worker.executor.SoloExecutor`, one slot in
this thread (``SIGALRM`` time limits; a claim takes an adaptive batch whose rows after the
first are claimed ahead and each started by the ack before it); with ``--threads N`` the
:class:`~django_jobguard.worker.executor.ThreadExecutor` (a claim takes as many rows as there
are free slots, within each queue's number). A worker without ``--threads`` turns to one
thread, for good, once it claims a sync job beside async ones, so that its sync jobs do not
stop it from claiming for the event loop.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from django_jobguard import aio, history, logs, queue, registry
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.exceptions import WorkerStoppedError
from django_jobguard.models import QUIET, STOP, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.outcome import JobState
from django_jobguard.retry import Defaults
from django_jobguard.worker import timeouts
from django_jobguard.worker.async_executor import AsyncExecutor
from django_jobguard.worker.claiming import ClaimAhead, ClaimSize
from django_jobguard.worker.completer import Completer
from django_jobguard.worker.executor import (
    EXIT_STUCK,
    AllThreadsStuck,
    Executor,
    SoloExecutor,
    ThreadExecutor,
)
from django_jobguard.worker.heartbeat import Heartbeat
from django_jobguard.worker.pipeline import Pipeline, log_finishing_error
from django_jobguard.worker.prefetch import Prefetch
from django_jobguard.worker.queue_selection import QueueEntry, QueueSelection
from django_jobguard.worker.stopping import GracefulStop

logger = logging.getLogger("django_jobguard.worker")
#: Seconds between two tries of a worker to register while its database cannot be reached.
REGISTER_EVERY = 1.0

EXIT_OK = 0
EXIT_MEMORY = 12
#: Seconds a worker relies on its last "when is the next job due" answer while NOTIFYs keep
#: waking it (see Worker._seconds_to_due); a claim that comes back empty asks again.
DUE_KNOWN_FOR = 0.25


class StopFlag(threading.Event):
    """A :class:`threading.Event` that a signal handler may set.

    A handler runs in the main thread between two bytecodes, possibly while that thread holds
    the event's lock inside ``wait()``; a plain Event's ``set()`` would then wait for that
    lock for ever (seen as a worker hanging on SIGINT followed by SIGTERM). Here the lock is
    re-entrant, so ``set()`` goes through; the interrupted ``wait()`` returns at its timeout
    at the latest."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())


@dataclass
class WorkerOptions:
    """What ``manage.py jobworker`` passes to :class:`Worker` (``queue:work``'s options)."""

    queues: list[str] = field(default_factory=lambda: [jobguard_settings.DEFAULT_QUEUE])
    sleep: float = 3.0
    tries: int = 1
    timeout: float | None = None
    backoff: list[float] = field(default_factory=lambda: [0.0])
    max_jobs: int = 0
    max_time: float = 0.0
    stop_when_empty: bool = False
    memory: int = 128
    rest: float = 0.0
    once: bool = False
    batch: int = 0  # rows per claim; 0: JOBGUARD['CLAIM_BATCH_SIZE'], adaptive when None
    using: str = field(default_factory=queue_database)  # JOBGUARD["DATABASE"]
    #: Async jobs run at once on the event loop; None: JOBGUARD['ASYNC_CONCURRENCY'].
    async_concurrency: int | None = None
    #: Jobs run at once in this process (``--threads``); 1 runs them one by one.
    threads: int = 1
    #: ``--queue name:N``: at most N jobs of the queue at once, and its weight (see
    #: queue_selection.py); every queue of ``queues`` has one, or none has.
    queue_limits: dict[str, int] = field(default_factory=dict)
    #: ``--stop-timeout``: seconds running jobs get after a graceful stop begins before they
    #: are interrupted and go back to the queue, attempt unused; 0 = as long as they take.
    stop_timeout: float = 0.0


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1_048_576
    except OSError:  # not Linux: peak RSS is the best we have
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RecentOutcomes:
    """Finished and failed jobs of the last ``window`` seconds (written at each heartbeat).

    Kept as one ``[second, done, failed]`` bucket per second, so memory stays at most
    ``window`` buckets however many jobs a second the worker runs (one entry per job grew a
    busy worker by megabytes a minute).
    """

    DONE = JobState.finished()

    def __init__(self, window: int = 60, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._buckets: deque[list[int]] = deque()
        self._lock = threading.Lock()

    def record(self, state: str) -> None:
        failed = state == JobState.FAILED
        if not failed and state not in self.DONE:
            return
        second = int(self._clock())
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != second:
                self._buckets.append([second, 0, 0])
                self._drop_old(second)
            self._buckets[-1][2 if failed else 1] += 1

    def counts(self) -> tuple[int, int]:
        """``(done, failed)`` within the window (to the second)."""
        with self._lock:
            self._drop_old(int(self._clock()))
            return (sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets))

    def _drop_old(self, second: int) -> None:
        while self._buckets and self._buckets[0][0] <= second - self.window:
            self._buckets.popleft()

    def __len__(self) -> int:
        """How many buckets are kept (at most ``window``)."""
        return len(self._buckets)


class Worker:
    """Runs jobs from ``options.queues`` until told to stop."""

    def __init__(self, options: WorkerOptions | None = None, *,
                 log: Callable[[str, str], None] | None = None,
                 log_running: bool = True) -> None:
        self.options = o = options or WorkerOptions()
        self._rss_checked = -1.0
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.jobs_processed = 0
        self._stop = StopFlag()
        #: Set when an operator quieted the worker (the admin, the API): it claims nothing
        #: more, its running jobs finish (``job.stopping`` is true in them), it stays up.
        self._quiet = threading.Event()
        self.pipeline = Pipeline(
            worker_id=self.id, using=o.using, log=log, log_running=log_running,
            defaults=Defaults(tries=o.tries, timeout=o.timeout, backoff=tuple(o.backoff)),
            pause=self._stop.wait, event_loop=True)
        # Set at the very end: the heartbeat renews leases while running jobs finish.
        self.halted: threading.Event = threading.Event()
        # job.stopping and --stop-timeout (stopping.py)
        self.graceful = GracefulStop(
            worker_id=self.id, stop=self._stop, quiet=self._quiet, halted=self.halted,
            max_time=o.max_time,
            stop_timeout=o.stop_timeout, interrupt_running=self.interrupt_running,
            interrupt_here=self.interrupt_job)
        self.pipeline.stopping = self.graceful.stopping
        # Async jobs: on this process's event loop, many at once (sync jobs never go there).
        self._async = AsyncExecutor(
            self.pipeline, o.async_concurrency or jobguard_settings.ASYNC_CONCURRENCY,
            self._async_finished)
        self._in_job = False
        self._listener: queue.Listener | None = None
        self._listener_lost_at: float | None = None
        # Rows an executor runs now (see show_running): with the waiting rows and the async
        # executor's, the only leases the heartbeat renews. A row whose ack or release failed
        # (database error) drops out, so its lease runs out and another worker retries it,
        # instead of this worker renewing it for the rest of its life.
        self._running: list[QueuedJob] = []
        #: Whether each job name's class is async, looked up once (see _runs_async).
        self._async_names: dict[str, bool] = {}
        self._recent = RecentOutcomes()
        self._per_queue = history.QueueCounter()  # the dashboard's history, per minute
        mode = history.history_mode()  # finished runs kept (JOBGUARD["HISTORY"]), or None
        self._run_history = None if mode == "off" else history.RunRecorder(
            self.id, failures_only=mode == "failures")
        self._claim_size = ClaimSize(fixed=o.batch or jobguard_settings.CLAIM_BATCH_SIZE)
        #: The solo worker's next claim, made while a backlog's batch runs (see run()).
        self._ahead = ClaimAhead()
        self._loop_thread: int | None = None  # the thread running the loop (run())
        self._claims_meanwhile = False
        #: Whether the last claim came back full (a backlog).
        self._backlog = False
        self._pause_checked = 0.0
        self._selection = QueueSelection([QueueEntry(name, o.queue_limits.get(name))
                                          for name in o.queues])
        #: Sync rows run here: one slot in this thread, or ``--threads`` (set by run()).
        self._executor: Executor = SoloExecutor(self, finished=self._claim_size.finished,
                                                rest=o.rest)
        self._finished_lock = threading.Lock()
        #: The solo executor's claimed sync rows not started yet (claimed ahead), oldest
        #: first: changed in this thread only (a row leaves it from the left as it starts,
        #: in constant time, not by a copy of the rest); the heartbeat reads a copy
        #: (``deque.copy()`` runs in C, so no change lands while it copies).
        self._waiting: deque[QueuedJob] = deque()
        #: Rows taken from the prefetch buffer to start, until an executor runs them (their
        #: starts may be a statement meanwhile); taken and put here under ``_moving``, which
        #: :meth:`held_ids` holds to read both, so no beat misses them.
        self._starting: list[QueuedJob] = []
        self._moving = threading.Lock()
        #: Every other claimed row not started yet (async rows, and the sync rows of
        #: ``--threads``): a slot that frees takes its next row from here itself.
        self._prefetch = Prefetch(self._runs_async)
        self._async.prefetch = self._prefetch
        self._buffer_pause_checked = 0.0
        #: ``(asked at, due at)``, time.monotonic(): the last :meth:`seconds_until_next_due`
        #: (forgotten when a claim comes back empty; see :meth:`_seconds_to_due`).
        self._due_known: tuple[float, float] | None = None
        #: Whether the last claim brought fewer rows than it asked for from the worker's
        #: only queue (nothing more was due then: what comes later is heard by LISTEN).
        self._drained = False
        #: Whether a NOTIFY ended the last wait (an empty claim after it asks for the next
        #: due time again).
        self._notified = False
        self._has_async_jobs = any(aio.is_async(cls) for cls in registry.all_jobs().values())
        self._heartbeat = Heartbeat(self, o.using)
        #: Finished jobs acked in groups (``COMPLETION_WINDOW``), or one ack per job.
        self._completer = Completer(
            worker_id=self.id, using=queue_database(o.using),
            window=float(jobguard_settings.COMPLETION_WINDOW),
            batch_size=jobguard_settings.COMPLETION_BATCH_SIZE,
        ) if Completer.wanted(queue_database(o.using)) else None
        self.pipeline.completer = self._completer
        self.pipeline.grouped_done = self._grouped_done

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Process jobs until a stop condition; returns the process exit code."""
        self._install_signal_handlers()
        logs.bind_worker(self.id)
        self._start()
        self.graceful.begin()
        # The watchdog's hard limit is the process's: a jobworker's, not a web server's
        # (an embedded worker runs in a thread of its own).
        in_main = threading.current_thread() is threading.main_thread()
        self.pipeline.hard_limits = in_main
        if self.options.threads > 1:
            self._executor = self._threads(self.options.threads)
        self._claims_meanwhile = self._may_claim_meanwhile()
        if self._claims_meanwhile and self._completer is None:  # (a group defers starts)
            self._loop_thread = threading.get_ident()
            self.pipeline.next_row = self._first_claimed_meanwhile
        try:
            return self._loop(time.monotonic(), may_turn=in_main and self._has_async_jobs)
        finally:
            self._async.wait()  # the async jobs running finish (or end by their timeout)
            self._shutdown()
            timeouts.clear_timer()  # the time limit's timer, left set between jobs

    def _loop(self, started: float, *, may_turn: bool) -> int:
        """Claim, hand out, stop or wait; again. Each pass enforces the running jobs' time
        limits (``tick``), starts the rows waiting for a slot, claims (the solo executor a
        batch ahead, the threads their free slots, within each queue's number), hands the
        rows out (async ones to the event loop, sync ones to the executor), checks the stop
        conditions, and waits for a free slot, a NOTIFY or a due job. On a stop condition or
        signal the running jobs finish (a second Ctrl-C hands them back); the rows claimed
        and never started go back to the queue, their attempts unused.

        ``may_turn`` (the main thread, some job async): the first claim that brings a sync
        job beside async ones turns the solo executor into one thread, for good: a sync job
        running in this thread would stop it from claiming for the event loop, and the async
        jobs of a queue holding both kinds would run one at a time. (An embedded worker never
        turns: its jobs have no time limits, a thread's would.)"""
        try:
            while not self._stop.is_set():
                self._executor.tick()
                self._hand_out([])
                # Jobs running while claiming may have kept a queue's number (its cap) full,
                # so an empty claim means an empty queue only if none ran then: otherwise
                # --stop-when-empty could stop with jobs left that the cap held back.
                running = self._executor.busy + len(self._async)
                if self._quiet.is_set() and (self._waiting or len(self._prefetch)
                                             or self._ahead.pending):
                    # claimed, never started: back to the queue, attempts unused
                    waiting, self._waiting = self._waiting, deque()
                    self._give_back([*waiting, *(self._ahead.take()[1] or [])]
                                    + self._prefetch.drain(close=True))
                self._give_back_paused()
                rows = [] if self._waiting or self._quiet.is_set() else self._claim()
                if may_turn and self._executor.claims_ahead and self._sync_beside_async(rows):
                    self._executor = self._threads(1)
                self._hand_out(rows)
                executor = self._executor
                busy = executor.busy + len(self._async)
                buffered = len(self._prefetch)
                code = self._stop_code(found=bool(rows) or busy > 0 or running > 0
                                       or buffered > 0,
                                       started=started,
                                       jobs=self.jobs_processed + executor.busy)
                if code is not None:
                    return code
                free = executor.free() + self._async.free()
                if rows and free and not (self._drained and self._listener is not None
                                          and not self.options.stop_when_empty):
                    # There may be more due. (A drained queue's next rows would wake the
                    # wait below, but --stop-when-empty must see the queue empty, not wait
                    # --sleep for rows that never come before it stops.)
                    continue
                if self._completer is not None and not busy:
                    # About to wait idle: nothing finished waits with it. (While jobs run, on
                    # threads or the loop, the group's timer writes it: a flush at each of
                    # their ends would make groups of one.)
                    self._completer.flush()
                if not free or self._waiting or (busy and self.options.stop_when_empty):
                    executor.wait(executor.seconds_to_next_check())
                elif buffered:  # woken as each job ends, to refill the buffer in time
                    executor.wait(min(executor.seconds_to_next_check(), 0.1))
                else:
                    self._wait(cap=executor.seconds_to_next_check() if busy else None)
            return EXIT_OK
        except AllThreadsStuck as exc:
            logger.critical("Worker %s: %s; exiting with code %s so that a new worker process "
                            "takes its place.", self.id, exc, EXIT_STUCK)
            return EXIT_STUCK
        finally:
            waiting, self._waiting = self._waiting, deque()
            self._give_back([*waiting, *self._ahead.close(), *self._prefetch.drain(close=True)])
            self._executor.shutdown()

    def _threads(self, size: int) -> Executor:
        """The executor of ``--threads`` (``size`` threads)."""
        return ThreadExecutor(self, size, rest=self.options.rest, prefetch=self._prefetch)

    def _may_claim_meanwhile(self) -> bool:
        """Whether the solo worker makes its next claim while a backlog's batch runs
        (:class:`ClaimAhead`): on PostgreSQL, from an unnumbered queue list, with no
        ``--once`` nor ``--max-jobs``, and not inside a transaction (a test's: the claim
        thread's own connection could not see its rows)."""
        o = self.options
        using = queue_database(o.using)
        connection = connections[using]
        return (self._executor.claims_ahead
                and not (o.once or o.max_jobs) and not self._selection.weighted
                and connection.vendor == "postgresql" and not connection.in_atomic_block)

    def _claim(self) -> list[QueuedJob]:
        """Claim the rows to run next: for the solo executor an adaptive batch whose first
        row starts now and the rest are claimed ahead, their attempts uncounted until each
        starts (a worker killed meanwhile has not used their tries), or the batch claimed
        while the one before ran (:meth:`_claim_meanwhile`); for threads as many rows as
        there are free slots, started. A failed claim is logged, and retried a second later
        on a fresh connection."""
        if self._ahead.pending:
            asked, taken, at = self._ahead.take()
            # An empty one (or a failure) is asked again now: the jobs that ran meanwhile
            # may have queued more (a chain's next link), and an empty claim may stop
            # ``--stop-when-empty``.
            if taken:
                return self._claimed(asked, taken, at)
        o = self.options
        executor = self._executor
        async_free = self._async.free() if self._has_async_jobs else 0
        buffered = len(self._prefetch)
        ahead = prefetching = 0
        if executor.claims_ahead:
            limit = 1 if o.once else self._claim_size.next()
            if self._has_async_jobs and not o.once:
                # Async rows wait in the prefetch buffer: no more than about AHEAD_SECONDS
                # of their work (their durations are the buffer's, not the claim size's).
                limit = max(1, min(limit, async_free + self._prefetch.target(
                    self._async.concurrency, most=self._claim_size.most)))
            if o.max_jobs:
                limit = max(1, min(limit, o.max_jobs - self.jobs_processed - len(self._async)))
            # The first row starts now, counted in the claim: unless it may be an async row
            # with no free slot (it would wait, its attempt counted).
            start = 0 if self._completer is not None or (
                self._has_async_jobs and not async_free) else 1
            if buffered:
                # Async rows wait in the prefetch buffer (the async slots take them as they
                # free): the next claim when it is down to half its size.
                if not self._selection.weighted:
                    ahead = self._prefetch.target(self._async.concurrency)
                if buffered > ahead // 2:
                    return []
        else:
            # Slots for async jobs only where any job is async: a claim cannot tell the kinds
            # apart, and a sync row claimed for an async slot waits for a thread in the
            # prefetch buffer (its lease renewed, its attempt counted only when it starts).
            free = executor.free()
            if not (o.once or o.max_jobs or self._selection.weighted):
                ahead = self._prefetch.target(executor.size + async_free)
            if buffered and (self._selection.weighted or o.once or o.max_jobs
                             or buffered > ahead
                             or (not (free or async_free) and buffered > ahead // 2)):
                # Enough ready (or a queue's number to keep): nothing to claim. Past the
                # buffer's target (0 for slow jobs) its rows wait for a slot of their kind:
                # claiming for the other kind's free slots could take the whole queue, one
                # row of the wrong kind at a time, from the workers with free threads.
                return []
            # A refill brings the buffer back to ``ahead``, never past every slot and
            # ``ahead`` (rows of one kind may wait while the other kind's slots are free).
            slots = executor.size + (self._async.concurrency if self._has_async_jobs else 0)
            limit = min(free + async_free + max(0, ahead - buffered),
                        slots + ahead - buffered)
            # Of those, the rows no slot waits for: a capped queue gives none of them.
            prefetching = max(0, limit - free - async_free)
            # Counted in the claim: only rows sure to start now, whatever their kind.
            start = min(free, async_free) if self._has_async_jobs else free
            if self._completer is not None:
                start = 0  # each row's start is counted as it starts, or in its group
            if o.once or o.max_jobs:
                limit = min(limit, (1 if o.once else o.max_jobs) - self.jobs_processed
                            - executor.busy - len(self._async))
            if limit < 1:
                return []
        running = self._selection.running(executor.running_queues()) \
            if self._selection.weighted else None
        at = time.monotonic()
        try:
            rows = self._claim_rows(limit, start=start, ahead=prefetching, running=running)
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("Claim failed (%s); reconnecting in 1 s.", exc)
            queue.close_broken_connections(all_idle=True)
            self._stop.wait(1)
            return []
        return self._claimed(limit, rows, at)

    def _claim_rows(self, limit: int, *, start: int, ahead: int,
                    running: Any = None) -> list[QueuedJob]:
        """Up to ``limit`` rows from the worker's queues, the first ``start`` started and
        ``ahead`` of them claimed for no slot (none of those from a capped queue)."""
        o = self.options
        return self._selection.claim(
            lambda names, n: queue.claim(names, worker_id=self.id, limit=n,
                                         start=min(n, start), named=o.queues,
                                         ahead=min(ahead, n), using=o.using),
            free=limit, running=running)

    def _claim_meanwhile(self) -> None:
        """While the solo worker runs a full batch (a backlog) of jobs that end within the
        claim's ``AHEAD_SECONDS`` at their recent average, its next batch is claimed on the
        claim thread: every row ahead (attempts uncounted; none from a capped queue), so the
        worker goes from one batch to the next without waiting for the database. (Slower
        jobs' rows are not claimed meanwhile: an idle worker can take them.)"""
        if self._stop.is_set() or self._quiet.is_set():
            return
        limit = self._claim_size.next()
        self._ahead.start(limit, lambda: self._claim_rows(limit, start=0, ahead=limit))

    def _first_claimed_meanwhile(self) -> QueuedJob | None:
        """As the solo executor's job is acked with no row of its batch left: the first row
        of the batch claimed meanwhile (waited for: the loop would wait for it next), taken
        into the rows waiting so that the ack starts it (one statement less a batch; at
        ``--batch 1``, a job). ``None`` (the loop hands the rows out) in any other thread
        (an async job's outcome, written in a pool thread, asks the same pipeline), when the
        claim holds an async row or async jobs run, and on a stop, a quiet or a pause of its
        queue."""
        if (self._waiting or threading.get_ident() != self._loop_thread
                or not self._executor.claims_ahead or len(self._async)):
            return None
        try:
            rows = self._ahead.back()
        except Exception:  # not this job's: the loop's take() raises it as before
            return None
        if (not rows or self._stop.is_set() or self._quiet.is_set()
                or any(self._runs_async(row) for row in rows)
                or self._paused_meanwhile(rows[0].queue)):
            return None
        asked, taken, at = self._ahead.take()
        self._waiting.extend(self._claimed(asked, taken or [], at))
        if (self._backlog and not self._ahead.pending
                and self._claim_size.fast(len(self._waiting))):
            self._claim_meanwhile()
        return self._waiting[0] if self._waiting else None

    def _claimed(self, limit: int, rows: list[QueuedJob], at: float) -> list[QueuedJob]:
        """What a claim of ``limit`` rows made at ``at`` (``time.monotonic()``) tells the
        worker; its rows."""
        o = self.options
        if self._executor.claims_ahead:
            self._claim_size.claimed(limit, len(rows))
        self._backlog = len(rows) >= limit
        self._pause_checked = at  # the claim excluded paused queues
        if not rows and self._notified:
            self._due_known = None  # woken for a job not due yet, or another took it: ask
        self._notified = False
        # One queue, fewer rows than asked: nothing else was due. The rows committed since
        # sent a NOTIFY, which ends the next wait at once: no empty claim needed to see it.
        self._drained = (len(rows) < limit and len(o.queues) == 1
                         and o.queues[0] != queue.ALL_QUEUES)
        return rows

    def _hand_out(self, rows: list[QueuedJob]) -> None:
        """Start the claimed rows that have a free slot of their kind, oldest first: async
        ones on the event loop, sync ones on the executor; the others wait (claimed, their
        leases renewed, attempts uncounted) until a slot frees. The solo executor's sync
        rows wait in order in ``_waiting`` (it runs each here, ``then`` the row after it,
        which its ack starts; before each row it sees a stop or a pause of the batch's queue
        and gives back the rows it did not start); every other row waits in the prefetch
        buffer, where a slot that frees takes its next row itself."""
        solo = self._executor.claims_ahead
        if rows:
            buffered = [row for row in rows if not solo or self._runs_async(row)]
            if solo:
                self._waiting.extend(row for row in rows if not self._runs_async(row))
            self._give_back(self._prefetch.put(buffered))
        self._start_from_buffer()
        if not solo:
            return
        if (rows and self._backlog and self._claims_meanwhile and not self._ahead.pending
                and self._claim_size.fast(len(self._waiting))):
            self._claim_meanwhile()
        waiting = self._waiting
        while waiting:
            row = waiting[0]
            if self._stop.is_set() or self._quiet.is_set() or self._paused_meanwhile(
                    row.queue):
                self._waiting = deque()
                self._give_back(list(waiting))
                return
            # Started: from now on the executor's (its row's lease is renewed as running;
            # shown running before it leaves the rows waiting, so no beat misses it).
            self.show_running([row])
            waiting.popleft()
            then = waiting[0] if waiting else None
            self._executor.submit(row, then=then)

    def _start_from_buffer(self) -> None:
        """Start buffered rows in the free slots: async ones on the event loop, and (with
        ``--threads``) sync ones on the executor's threads. The attempts of those claimed
        ahead are counted in one statement (not one UPDATE each as they start)."""
        starting: list[tuple[QueuedJob, bool]] = []
        free_async = self._async.free() if self._has_async_jobs else 0
        free_sync = 0 if self._executor.claims_ahead else self._executor.free()
        if not free_async and not free_sync:
            return
        with self._moving:
            for is_async, free in ((True, free_async), (False, free_sync)):
                for _ in range(free):
                    row = self._prefetch.take(is_async=is_async)
                    if row is None:
                        break
                    starting.append((row, is_async))
            self._starting = [row for row, _ in starting]
        if not starting:
            return
        try:
            self._start_taken(starting)
        finally:
            self._starting = []

    def _start_taken(self, starting: list[tuple[QueuedJob, bool]]) -> None:
        """:meth:`_start_from_buffer`'s rows taken from the buffer, started: their attempts
        counted at once, each then handed to its executor (or LOST if another worker took
        it meanwhile)."""
        ahead = [row for row, _ in starting if queue.claimed_ahead(row)
                 and not (self._completer is not None and self._completer.defers(row))]
        lost: list[QueuedJob] = []
        if len(ahead) > 1:
            try:
                lost = queue.start_many(ahead, using=self.options.using)
            except (DatabaseError, InterfaceError) as exc:  # each starts on its own then
                logger.warning("Could not start %s jobs at once (%s).", len(ahead), exc)
                queue.close_broken_connections()  # (their starts here need a new one)
        handed = False
        for row, is_async in starting:
            if lost and row in lost:  # taken over meanwhile: another worker runs it
                self.job_finished(self.pipeline.lost(row), row.queue)
                continue
            if is_async:
                self._async.submit(row)
            else:
                self._executor.submit(row)
                handed = True
        if handed:
            # The GIL to the threads just woken now, not when this loop next blocks: their
            # jobs start sooner (bench/steady.py, --threads 20 at 200 jobs/s: p50 ~2.0 ->
            # ~1.25 ms).
            time.sleep(0)

    def _give_back_paused(self, every: float = 1.0) -> None:
        """Give back the buffered rows of queues paused since their claim (asked at most
        once per ``every`` seconds, and only while rows are buffered)."""
        if not len(self._prefetch):
            return
        now = time.monotonic()
        if now - self._buffer_pause_checked < every:
            return
        self._buffer_pause_checked = now
        try:
            names = queue.paused(sorted(self._prefetch.queues()), using=self.options.using)
        except (DatabaseError, InterfaceError):
            return
        if names:
            self._give_back(self._prefetch.take_queues(set(names)))

    def _give_back(self, rows: Sequence[QueuedJob]) -> None:
        """Put back claimed rows that never started here, their attempt unused."""
        for row in rows:
            try:
                queue.release(row, count_attempt=False, using=self.options.using)
            except (DatabaseError, InterfaceError) as exc:
                logger.warning("Could not put back %s (%s); its lease will bring it back.",
                               row, exc)

    def _sync_beside_async(self, rows: list[QueuedJob]) -> bool:
        """Whether ``rows`` hold a sync job and async jobs run now or come with it."""
        if not rows:
            return False
        kinds = [self._runs_async(row) for row in rows]
        return not all(kinds) and (any(kinds) or len(self._async) > 0)

    def _runs_async(self, row: QueuedJob) -> bool:
        """Whether ``row``'s job is async (looked up once per job name: asked several times
        for every row)."""
        known = self._async_names.get(row.name)
        if known is None:
            known = self._async_names[row.name] = self._is_async_name(row.name)
        return known

    @staticmethod
    def _is_async_name(name: str) -> bool:
        try:
            return aio.is_async(registry.get(name))
        except registry.UnknownJobError:
            return False  # the pipeline deals with it

    def _async_finished(self, row: QueuedJob, state: str | None) -> None:
        """An async job ended (called from the loop thread)."""
        self.job_finished(state or "", row.queue)
        if self._coordinator_needed():
            self._executor.wake()  # the loop may claim into the freed slot

    def _coordinator_needed(self) -> bool:
        """Whether an async job that ended leaves the coordinator something to do: a freed
        slot, or the prefetch buffer down to where its claim refills it. Its slot taken by
        a buffered row leaves it nothing (waking it for each job cost a thread switch and a
        turn of its loop per job); it looks again within its wait anyway."""
        o = self.options
        if (not self._executor.claims_ahead or self._selection.weighted or o.once
                or o.max_jobs or self._stop.is_set() or self._quiet.is_set()
                or self._async.free()):
            return True
        return len(self._prefetch) <= self._prefetch.target(self._async.concurrency) // 2

    def _grouped_done(self, row: QueuedJob, state: str) -> None:
        """A row acked in a completion group (any thread): counted as a job that ended."""
        with self._finished_lock:
            self._recent.record(state)
            self._per_queue.record(row.queue, state)

    def job_finished(self, state: str, queue: str) -> None:
        """Count a job of ``queue`` an executor thread finished (any thread)."""
        with self._finished_lock:
            self._recent.record(state)
            self._per_queue.record(queue, state)
            self.jobs_processed += 1

    def show_running(self, rows: list[QueuedJob]) -> None:
        """The rows an executor runs now: their leases are renewed, the Worker row lists
        them (twice per job: the ids are read only by the heartbeat, when it beats)."""
        self._running = rows

    @property
    def current_job(self) -> str:
        """The ids of the rows running now, as the Worker row's ``current_job`` shows them."""
        return ",".join(str(row.id) for row in self._running)

    def recent_counts(self) -> tuple[int, int]:
        """``(done, failed)`` in the last minute, for the Worker row."""
        return self._recent.counts()

    def flush_history(self) -> None:
        """Add the jobs finished since the last call to the dashboard's per-minute counts,
        and insert the finished runs buffered for the history (``HISTORY``)."""
        try:
            self._per_queue.flush(self.options.using)
        finally:
            if self._run_history is not None:
                self._run_history.flush(self.options.using)

    def held_ids(self) -> frozenset[Any]:
        """Ids of every row this worker holds: running (sync and async), claimed ahead, or
        waiting for a slot (the heartbeat renews their leases). Read in the order rows move
        through them (claimed ahead, buffered, waiting, running, finished in a group): a row
        that moves on between two reads is found where it went, not missed by both."""
        held = set(self._ahead.ids())
        with self._moving:
            held |= self._prefetch.ids()
            held.update(row.id for row in self._starting)
        held |= self._executor.held()  # (its threads take their next rows from the buffer)
        held.update(row.id for row in self._waiting.copy())
        held.update(row.id for row in self._running)
        held |= self._async.held()
        if self._completer is not None:
            held |= self._completer.held()
        return frozenset(held)

    def _paused_meanwhile(self, queue_name: str) -> bool:
        """Whether ``queue_name`` was paused since the claim, asked at most once a second
        (a pause holds within a second even in the middle of a long batch)."""
        now = time.monotonic()
        if now - self._pause_checked < 1.0:
            return False
        self._pause_checked = now
        try:
            return bool(queue.paused([queue_name], using=self.options.using))
        except (DatabaseError, InterfaceError):
            return False

    def _stop_code(self, *, found: bool, started: float,
                   jobs: int | None = None) -> int | None:
        """``queue:work``'s stop checks, in its order; ``None`` means keep going (``jobs``:
        the jobs done or started, for ``--max-jobs``)."""
        o = self.options
        if self._stop.is_set():
            return EXIT_OK
        if o.memory and self._memory_exceeded(o.memory):
            logger.warning("Worker %s uses more than %s MB; exiting.", self.id, o.memory)
            return EXIT_MEMORY
        if o.once or (o.stop_when_empty and not found):
            return EXIT_OK
        if o.max_time and time.monotonic() - started >= o.max_time:
            return EXIT_OK
        done = self.jobs_processed if jobs is None else jobs
        if o.max_jobs and done + len(self._async) >= o.max_jobs:
            return EXIT_OK
        return None

    def _memory_exceeded(self, limit_mb: int) -> bool:
        """RSS above ``limit_mb``; read at most twice a second (it costs a file read)."""
        now = time.monotonic()
        if now - self._rss_checked < 0.5:
            return False
        self._rss_checked = now
        return _rss_mb() >= limit_mb

    def _wait(self, cap: float | None = None) -> None:
        """Idle until ``--sleep`` passes, the next delayed job is due, a NOTIFY arrives
        (PostgreSQL), a stop signal, or ``cap`` seconds."""
        wait = min(self.options.sleep, self._seconds_to_due())
        deadline = time.monotonic() + (wait if cap is None else min(wait, cap))
        self._reopen_listener()
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            chunk = min(remaining, 1.0)
            if self._listener is not None:
                try:
                    if self._listener.wait(chunk):
                        self._notified = True
                        return
                except Exception as exc:  # lost connection: fall back to polling
                    logger.warning("LISTEN connection lost (%s); polling until it is back.",
                                   exc)
                    self._listener.close()
                    self._listener = None
                    self._listener_lost_at = time.monotonic()
            else:
                self._stop.wait(chunk)

    def _reopen_listener(self, retry_every: float = 5.0) -> None:
        """LISTEN again a while after the listening connection was lost (server restart,
        ``pg_terminate_backend``), so the worker does not poll for the rest of its life."""
        lost = self._listener_lost_at
        if self._listener is not None or lost is None or time.monotonic() - lost < retry_every:
            return
        self._open_listener(again=True)

    def _open_listener(self, *, again: bool = False) -> None:
        """LISTEN for new jobs. Where LISTEN cannot wake this worker (a transaction-pooling
        PgBouncer without ``LISTEN_DATABASE``) it says why once and polls at ``--sleep`` for
        good; a connection error is retried by :meth:`_reopen_listener`."""
        try:
            self._listener = queue.listen(self.options.using)
            self._listener_lost_at = None
        except queue.ListenUnavailable as exc:
            logger.warning("%s Worker %s polls every %g s (--sleep) instead.", exc, self.id,
                           self.options.sleep)
            self._listener_lost_at = None  # the setup, not an outage: asking again won't help
        except Exception as exc:
            logger.warning("LISTEN %sunavailable (%s); polling.", "still " if again else "",
                           exc)
            self._listener_lost_at = time.monotonic()

    def _seconds_to_due(self) -> float:
        """:meth:`seconds_until_next_due`, asked again only when the last answer is more
        than :data:`DUE_KNOWN_FOR` seconds old or a claim right after a NOTIFY came back
        empty (the NOTIFY was for something not due yet: a delayed job). The worker claims
        after each NOTIFY and waits again: one query per wait was a quarter of its round
        trips per job."""
        now = time.monotonic()
        known = self._due_known
        if known is not None and now - known[0] < DUE_KNOWN_FOR:
            return max(known[1] - now, 0.01)
        wait = self.seconds_until_next_due()
        self._due_known = (now, now + wait)
        return wait

    def seconds_until_next_due(self) -> float:
        """Seconds until the earliest delayed or leased job in our queues becomes due, by the
        database clock (a worker whose own clock runs ahead would otherwise poll in a loop)."""
        try:
            wait = queue.seconds_until_due(self.options.queues, using=self.options.using)
        except (DatabaseError, InterfaceError):
            return self.options.sleep
        if wait is None:
            return self.options.sleep
        return max(wait, 0.01)

    # -- one job -----------------------------------------------------------------------

    def process_claimed(self, row: QueuedJob, *, then: QueuedJob | None = None) -> None:
        """Run :meth:`process`; a database error leaves the row to lease recovery."""
        self._in_job = True
        try:
            state = self.process(row, then=then)
            self._recent.record(state)
            self._per_queue.record(row.queue, state)
        except Exception as exc:
            if log_finishing_error(row, exc):
                self._stop.wait(1)  # back off: the failing service may be restarting
        finally:
            self._in_job = False
            with self._finished_lock:
                self.jobs_processed += 1
            queue.close_broken_connections()

    def process(self, row: QueuedJob, *, then: QueuedJob | None = None) -> str:
        """Run one claimed row through the pipeline; returns the state logged (``then``:
        the row claimed ahead that runs next, started by this one's ack)."""
        return self.pipeline.process(row, then=then)

    # -- timeouts, signals, logging ----------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        interrupts = 0

        def on_stop(signum: int, frame: Any) -> None:
            # Only a second SIGINT (Ctrl-C again) stops at once: SIGTERM may come twice
            # without anyone asking for it (systemd signals the whole cgroup, and the
            # supervisor passes it on), and a running job must not be cut off for that.
            nonlocal interrupts
            if signum == signal.SIGINT:
                interrupts += 1
            if interrupts > 1:
                self._stop_at_once()
                return
            if not self._stop.is_set():
                logger.warning("Worker %s got %s; finishing the current job%s.", self.id,
                               signal.Signals(signum).name,
                               " (Ctrl-C again to stop at once)"
                               if signum == signal.SIGINT else "")
            self._stop.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)

    def stop(self) -> None:
        """Ask the worker to exit after the current job."""
        self._stop.set()

    def quiet(self) -> None:
        """Claim nothing more and let the running jobs finish; the rows claimed ahead go
        back to the queue, their attempts unused. The worker stays up (idle) until stopped."""
        self._quiet.set()
        self._executor.wake()

    def obey(self, command: str) -> None:
        """Do what an operator asked through this worker's row (``Worker.command``, read by
        the heartbeat): ``quiet`` or ``stop`` (a graceful stop, as SIGTERM: the running jobs
        finish and the worker exits 0)."""
        if command == STOP and not self._stop.is_set():
            logger.warning("Worker %s was asked to stop (from the console); finishing the "
                           "running jobs.", self.id)
            self.stop()
            self._executor.wake()
        elif command == QUIET and not self._quiet.is_set():
            logger.warning("Worker %s was quieted (from the console): it claims no more jobs; "
                           "the running ones finish.", self.id)
            self.quiet()

    @property
    def run_state(self) -> str:
        """``running``, ``quiet`` or ``stopping``, as the Worker row shows it."""
        if self.graceful.stop_asked():
            return "stopping"
        return "quiet" if self._quiet.is_set() else "running"

    def interrupt_job(self, error: WorkerStoppedError) -> None:
        """In a signal handler: raise ``error`` into the running job, which then goes back to
        the queue with its attempt unused; nothing when no job can be interrupted."""
        if self.pipeline.interruptible() is not None:
            raise error

    def interrupt_running(self, error: type[WorkerStoppedError]) -> bool:
        """Interrupt the jobs running on the event loop and on threads (``error`` raised in
        each; ``--stop-timeout``): each goes back to the queue, its attempt unused. True
        when a job runs in the main thread, which only a signal handler can interrupt."""
        self._async.stop_all()
        if isinstance(self._executor, ThreadExecutor):
            self._executor.abort(error)
            return False
        return self.pipeline.interruptible() is not None

    def _stop_at_once(self) -> None:
        self._stop.set()
        self._async.stop_all()  # each async job goes back to the queue, its attempt unused
        self._executor.abort()  # the solo one raises into the job it runs (this thread's)

    # -- start-up, heartbeat, shutdown -----------------------------------------------

    def _start(self) -> None:
        o = self.options
        self._register()
        if self._run_history is not None:
            self._run_history.start()
        if not o.once and jobguard_settings.USE_NOTIFY:
            self._open_listener()
        self._heartbeat.start()

    def _register(self) -> None:
        """Write this worker's row. A worker started while its database cannot be reached
        (a restart, a failover, a terminated connection) says so and tries again every
        :data:`REGISTER_EVERY` seconds, as a claim does, until it can or it is stopped,
        instead of exiting with the error."""
        every = REGISTER_EVERY
        while True:
            try:
                WorkerRow.objects.using(self.options.using).update_or_create(
                    id=self.id, defaults=self.identity())
                return
            except (DatabaseError, InterfaceError) as exc:
                logger.warning("Could not register worker %s (%s); retrying in %g s.",
                               self.id, exc, every)
                queue.close_broken_connections(all_idle=True)
                if self._stop.wait(every):
                    return  # stopped meanwhile: the loop sees it and the worker ends

    def heartbeat(self) -> None:
        """Renew this worker's leases and write its liveness and last-minute counts (the
        heartbeat thread's steps about this worker; see :mod:`.heartbeat`)."""
        self._heartbeat.keep_alive()

    def identity(self) -> dict[str, Any]:
        """The fields of this worker's row that never change."""
        return {"hostname": socket.gethostname(), "pid": os.getpid(),
                "queues": ",".join(self.options.queues)}

    def _shutdown(self) -> None:
        if self._completer is not None:
            self._completer.close()  # the acks still waiting for their group
        self._stop.set()
        self.halted.set()
        self._heartbeat.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
        queue.close_claim_connections()  # (the loop's thread claimed)
        try:
            self.flush_history()  # what ran since the last heartbeat
        except (DatabaseError, InterfaceError):
            pass  # the database is gone: the dashboard's history misses these counts and runs
        if self._run_history is not None:
            self._run_history.stop()
        try:
            WorkerRow.objects.using(self.options.using).filter(id=self.id).delete()
        except (DatabaseError, InterfaceError):
            pass


def run_worker(queues: Sequence[str], **options: Any) -> int:
    """Run a worker in this thread (tests, scripts): ``run_worker(["default"], once=True)``."""
    return Worker(WorkerOptions(queues=list(queues), **options)).run()


def run_worker_process(options: WorkerOptions, *, verbosity: int = 1,
                       write: Callable[[str, str], None] | None = None,
                       own_process: bool = False) -> int:
    """Run one worker in this process (``jobworker`` and each ``--concurrency`` child); its
    job lines are ``logging`` records (:mod:`~django_jobguard.logs`, shown by the handler
    the command installs), RUNNING ones from ``verbosity`` 2, debug logging at 3.
    ``own_process``: the process exists to run this worker (``jobworker`` run from the
    command line, a ``--concurrency`` child), so what it loaded is frozen
    (:func:`freeze_loaded`); not a test's or a script's ``call_command()``."""
    worker = make_worker(options, verbosity=verbosity, write=write)
    if own_process:
        freeze_loaded()
        if options.threads <= 1:
            sys.setswitchinterval(SWITCH_INTERVAL)
    return worker.run()


#: How long a thread of a worker that owns its process waits at most for the GIL while the
#: job's thread runs Python (``sys.setswitchinterval``; Python's default is 5 ms). The
#: worker's other threads (the claim ahead, the completion group's timer, the heartbeat, the
#: event loop's pool) wait on sockets, and each needs the GIL as its statement returns: at
#: 5 ms a hand-over a claim of 128 rows took 15 ms where its statement took 5, and the job's
#: thread, done with its batch, waited for it (1.0 s over 40,000 no-op jobs, and 0.23 s for
#: completion groups it wrote itself; 0.10 s and 0.04 s at 0.5 ms). Not under ``--threads``,
#: whose job threads, when they compute, would hand the GIL back and forth ten times as often.
SWITCH_INTERVAL = 0.0005


def freeze_loaded() -> None:
    """Take what is alive now (Django, the apps, the registered jobs: the worker's for its
    whole life) out of the cyclic garbage collector's scans: ``gc.freeze()``, after a
    collection so that no garbage is frozen with it. A worker's claimed rows outlive the
    young generations, so full collections come every few thousand jobs; each scanned all
    of it (about 25 ms, 4 µs a no-op job; half that frozen). Objects freed by their
    reference count are freed as before; a ``fork()`` after it shares more pages."""
    gc.collect()
    gc.freeze()


def make_worker(options: WorkerOptions, *, verbosity: int = 1,
                write: Callable[[str, str], None] | None = None) -> Worker:
    """The worker :func:`run_worker_process` runs (``jobworker --reload`` runs it itself);
    ``write(line, state)`` also gets each job line shown at ``verbosity``."""
    log = None
    if write is not None:
        def log(line: str, state: str) -> None:
            if verbosity >= 2 or (verbosity >= 1 and state != JobState.RUNNING):
                write(line, state)

    if verbosity >= 3:
        logging.getLogger("django_jobguard").setLevel(logging.DEBUG)
    running = verbosity >= 2 or logs.job_logger.isEnabledFor(logging.DEBUG)
    return Worker(options, log=log, log_running=running)
