"""The executors the worker loop hands claimed rows to: one slot in the loop's own thread
(:class:`SoloExecutor`, the default) or ``N`` threads (:class:`ThreadExecutor`,
``jobworker --threads N``). As celery's ``solo`` pool is a pool, one job at a time is an
executor with one slot, so :class:`~django_jobguard.worker.Worker` has one loop for both.

The worker's main thread stays the coordinator (signals, claims, LISTEN or polling, stop
conditions, the memory limit; see :meth:`Worker.run <django_jobguard.worker.Worker.run>`);
a :class:`ThreadExecutor` runs what it claims on ``N`` executor threads. Each thread has its
own :class:`~django_jobguard.worker.pipeline.Pipeline` and its own database connection (Django's
connections are per thread; closed when the thread ends), so middleware, outcomes and owner
checks are exactly those of a single-job worker.

The interface the worker loop uses (:class:`Executor`; the async executor has the same
``free``/``submit``/``wait`` shape):

- :attr:`~Executor.size`, :meth:`~Executor.free`, :attr:`~Executor.busy`,
  :meth:`~Executor.running_queues`: what may be claimed now; :attr:`~Executor.claims_ahead`:
  whether a claim takes a batch ahead of the free slots (solo: started one by one, each by
  the ack of the row before it) or only as many rows as there are free slots;
- :meth:`~Executor.submit`: run a claimed row (attempt counted, lease held), ``then`` the
  row claimed ahead that runs next; the solo executor returns when the row is done;
- :meth:`~Executor.tick`: time limits and stuck threads (call it often, from the
  coordinator); :meth:`~Executor.wait`: until a job ends or ``timeout``; :meth:`~Executor.wake`
  ends a wait;
- :meth:`~Executor.abort` (from a signal handler) and :meth:`~Executor.shutdown`: a graceful
  stop finishes the running jobs, an abort hands them back to the queue.

What it needs of its worker is :class:`Coordinator`: count finished jobs, and learn which
rows run now (the heartbeat renews their leases; the Worker row's ``current_job`` lists
them all).

**Time limits.** No signal reaches a job in another thread. At its ``timeout`` the
coordinator raises :class:`~django_jobguard.worker.timeouts.ThreadTimeoutError` in the job's thread
(between two bytecodes, as SIGALRM does in the main thread), so a job running Python code
ends as a timed-out attempt, retried or failed by its policy, in its own thread. A job in C
code or a blocking call (``time.sleep``, a socket read without timeout) cannot be
interrupted: :data:`~django_jobguard.worker.timeouts.GRACE` seconds after its timeout the
coordinator *ends the attempt itself* (timed out: retried or failed per its policy, owner-
checked on the row's claim so the stuck thread's late ack or release changes nothing), stops
renewing its lease, and starts a new thread in its place. The stuck thread is left alone
(Python cannot kill a thread): when its call returns, the pending timeout is raised in it,
its writes find the row no longer theirs (logged LOST), and it exits, closing its
connection. Its middleware still holds what it held (a ``WithoutOverlapping`` lock stays
taken until it ends or expires, which is right: its code still runs). When as many threads
are stuck as the worker has slots, the worker exits with :data:`EXIT_STUCK` so that its
supervisor (``--concurrency``, systemd, Kubernetes) starts a fresh process. The watchdog
process keeps the hard limit: if a thread holds the GIL so that the coordinator itself cannot
run, the whole process is killed at the job's hard limit, as with one job at a time.
"""

from __future__ import annotations

import logging
import math
import queue as stdlib_queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DatabaseError, InterfaceError, connections

from django_jobguard import logs, queue
from django_jobguard.exceptions import JobTimeoutError, WorkerStoppedError
from django_jobguard.worker import timeouts
from django_jobguard.worker.pipeline import Pipeline, log_finishing_error

if TYPE_CHECKING:
    from django_jobguard.models import QueuedJob
    from django_jobguard.worker.prefetch import Prefetch

logger = logging.getLogger("django_jobguard.worker")

#: Exit code of a worker whose threads are all stuck in jobs past their time limit.
EXIT_STUCK = 13
#: Seconds an abort (a second Ctrl-C) gives the running jobs to go back to the queue
#: themselves before the coordinator puts back the rows of those still running.
ABORT_GRACE = 3.0


class Coordinator(Protocol):
    """What an executor needs of the worker that owns it (:class:`~django_jobguard.worker.
    Worker` implements it)."""

    #: The worker's own pipeline: executor pipelines copy its settings; the coordinator's
    #: writes (a stuck job's attempt ended) go through it. ``pipeline.pause(seconds)``
    #: waits, and returns early when the worker is told to stop.
    pipeline: Pipeline

    def job_finished(self, state: str, queue: str) -> None:
        """Count a finished job of ``queue`` (``state`` as logged: DONE, FAILED, ...); any
        thread."""

    def show_running(self, rows: list[QueuedJob]) -> None:
        """``rows`` are the jobs running now: renew their leases, show them on the Worker
        row (called under the executor's lock)."""


class Executor(Protocol):
    """What the worker loop asks of an executor (see the module docstring)."""

    size: int
    #: Claims take a batch (adaptive, ``--batch``), the rows after the first started by the
    #: ack before them; otherwise as many rows as there are free slots, all started.
    claims_ahead: bool

    def free(self) -> int:
        """How many more rows may start now."""

    @property
    def busy(self) -> int:
        """How many jobs run now."""

    def running_queues(self) -> Counter[str]:
        """Running jobs per queue name."""

    def held(self) -> frozenset[Any]:
        """Ids of the rows it runs or has taken to run next, read under the lock it takes
        them from the prefetch buffer with (the heartbeat misses none on its way)."""

    def submit(self, row: QueuedJob, *, then: QueuedJob | None = None) -> None:
        """Run ``row``; ``then`` is the row claimed ahead that its ack starts."""

    def tick(self) -> None:
        """Enforce what the coordinator enforces (time limits of jobs in other threads)."""

    def seconds_to_next_check(self) -> float:
        """When :meth:`tick` has something to do next."""

    def wait(self, timeout: float) -> None:
        """Until a job ends, :meth:`wake`, or ``timeout`` seconds."""

    def wake(self) -> None:
        """End a :meth:`wait` now."""

    def abort(self) -> None:
        """Hand the running jobs back to the queue (a second Ctrl-C, in the handler)."""

    def shutdown(self) -> None:
        """Let the running jobs finish (after :meth:`abort`: hand them back), then stop."""


class SoloExecutor:
    """One slot in the calling thread (the worker's main thread, or an embedded worker's):
    each row runs to its end inside :meth:`submit`, so ``SIGALRM`` time limits and a second
    Ctrl-C reach the job directly. celery's ``solo`` pool."""

    size = 1
    claims_ahead = True
    busy = 0  # asked only between jobs: submit() returns when the job is done

    def __init__(self, worker: Any, *, finished: Callable[[float], None],
                 rest: float = 0.0) -> None:
        self.worker = worker  # a Worker: process_claimed(), pipeline, stop
        #: Called with each job's duration (the adaptive claim size learns from it).
        self.finished = finished
        self.rest = rest
        self._cond = threading.Condition()

    def free(self) -> int:
        """One: the slot is free whenever the loop asks."""
        return 1

    def running_queues(self) -> Counter[str]:
        """None run between jobs."""
        return Counter()

    def held(self) -> frozenset[Any]:
        """None: its one row is the worker's running row (``show_running``), and it takes
        none from the prefetch buffer."""
        return frozenset()

    def submit(self, row: QueuedJob, *, then: QueuedJob | None = None) -> None:
        """Run ``row`` here and now (``then``: started by its ack), then rest (``--rest``)."""
        began = time.monotonic()
        self.worker.show_running([row])
        try:
            self.worker.process_claimed(row, then=then)
        finally:
            self.worker.show_running([])
        self.finished(time.monotonic() - began)
        if self.rest:
            time.sleep(self.rest)

    def tick(self) -> None:
        """Nothing: ``SIGALRM`` and the watchdog enforce the limits in this thread."""

    def seconds_to_next_check(self) -> float:
        """Never: nothing to check from outside the job."""
        return math.inf

    def wait(self, timeout: float) -> None:
        """Until :meth:`wake` (an async job ended) or ``timeout`` seconds, at most one (so
        that a stop is seen)."""
        with self._cond:
            self._cond.wait(min(timeout, 1.0))

    def wake(self) -> None:
        """End a :meth:`wait` now."""
        with self._cond:
            self._cond.notify_all()

    def abort(self) -> None:
        """Raise :class:`WorkerStoppedError` into the running job (in the signal handler,
        which runs in this thread); the job goes back to the queue, its attempt unused."""
        pipeline = self.worker.pipeline
        if pipeline.interruptible() is not None:
            logger.warning("Worker %s got SIGINT again; stopping at once, the job goes back "
                           "to the queue.", pipeline.worker_id)
        self.worker.interrupt_job(WorkerStoppedError(WorkerStoppedError.detail))

    def shutdown(self) -> None:
        """Nothing runs after the loop: the last job ended inside :meth:`submit`."""


class AllThreadsStuck(Exception):
    """As many executor threads are stuck past their jobs' time limits as the worker has
    slots: the process must be replaced."""


class _Stopped(WorkerStoppedError):
    """:class:`WorkerStoppedError` as raised into a thread (given as a class)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(args or (self.detail,)))


@dataclass
class _Running:
    row: QueuedJob
    started: float  # time.monotonic()


class _Slot:
    """One executor thread: takes rows from its inbox and runs them through its pipeline."""

    def __init__(self, executor: ThreadExecutor, number: int) -> None:
        self.executor = executor
        self.number = number
        self.inbox: stdlib_queue.SimpleQueue[QueuedJob | None] = stdlib_queue.SimpleQueue()
        self.pipeline = executor.new_pipeline()
        if executor.prefetch is not None:
            self.pipeline.next_row = self._take_next
        self.running: _Running | None = None
        #: The buffered row this thread runs next, taken as its job's outcome was written.
        self.following: QueuedJob | None = None
        self.abandoned = False
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"jobguard-executor-{number}")
        self.thread.start()

    def _loop(self) -> None:
        timeouts.enforce_in_this_thread()
        logs.bind_worker(self.pipeline.worker_id)  # its warnings name the worker
        try:
            while True:
                try:
                    row = self.inbox.get()
                except (timeouts.ThreadTimeoutError, _Stopped):
                    continue  # raised as its job ended: there is nothing left to stop
                if row is None:
                    return
                # Its row, then each row the prefetch buffer has ready as one ends: taken in
                # this thread, no hand-off through the coordinator.
                following: QueuedJob | None = row
                while following is not None:
                    following = self._run(following)
                    if self.abandoned:
                        return
        finally:
            connections.close_all()  # this thread's connections only

    def _take_next(self) -> QueuedJob | None:
        """The row to run next (asked by the pipeline as it writes an outcome)."""
        if self.following is None:
            self.following = self.executor._take_for(self)
        return self.following

    def _run(self, row: QueuedJob) -> QueuedJob | None:
        """Run ``row``; returns the next row to run here (taken from the prefetch buffer as
        this one ended), or ``None`` (the slot went idle)."""
        state = ""
        following = None
        try:
            state = self.pipeline.process(row)
        except (timeouts.ThreadTimeoutError, _Stopped):
            # Raised as the job left its time limit (it ran out just then): the outcome was
            # written, or the row's lease brings it back.
            logger.warning("%s [%s]: its timeout or stop arrived as the job ended.", row.name,
                           row.id)
        except Exception as exc:
            if log_finishing_error(row, exc):
                self.executor.worker.pipeline.pause(1)  # back off: the service may restart
        finally:
            timeouts.forget_thread_limit()
            if self.executor.rest and not self.abandoned:
                self.executor.worker.pipeline.pause(self.executor.rest)
            queue.close_broken_connections()
            following = self.executor._finished(self, row, state)
        return following


class ThreadExecutor:
    """Runs up to ``size`` claimed rows at once on threads (see the module docstring)."""

    claims_ahead = False  # a free slot takes a row at once

    def __init__(self, worker: Coordinator, size: int, *, rest: float = 0.0,
                 prefetch: Prefetch | None = None) -> None:
        self.worker = worker
        self.size = size
        #: Rows claimed ahead: a thread whose job ends takes the next one from here itself
        #: (:mod:`~django_jobguard.worker.prefetch`).
        self.prefetch = prefetch
        #: Set by :meth:`shutdown`: no thread takes a buffered row any more.
        self.closing = False
        #: Seconds a thread rests after each job (``--rest``).
        self.rest = rest
        self._cond = threading.Condition()
        self._log_lock = threading.Lock()
        self._numbers = iter(range(1, 1_000_000))
        self._idle: list[_Slot] = []
        self._busy: dict[_Slot, _Running] = {}
        self._stuck: list[_Slot] = []
        self._aborted = False
        for _ in range(size):
            self._idle.append(_Slot(self, next(self._numbers)))

    # -- what the coordinator asks -------------------------------------------------------

    def new_pipeline(self) -> Pipeline:
        """A pipeline like the worker's, for one thread (log lines written one at a time)."""
        main = self.worker.pipeline
        write = main.log  # the logging records need no lock; an in-process callback might
        log = None
        if write is not None:
            def log(line: str, state: str) -> None:
                with self._log_lock:
                    write(line, state)

        pipeline = Pipeline(worker_id=main.worker_id, using=main.using,
                            defaults=main.defaults, log=log, log_running=main.log_running,
                            pause=main.pause, event_loop=main.event_loop)
        pipeline.stopping = main.stopping
        pipeline.completer, pipeline.grouped_done = main.completer, main.grouped_done
        return pipeline

    def free(self) -> int:
        """How many more rows may start now."""
        with self._cond:
            return len(self._idle)

    @property
    def busy(self) -> int:
        """How many jobs run now, and rows taken to run next on a thread (their jobs start
        as the ones before end: ``--max-jobs`` counts them)."""
        with self._cond:
            return len(self._busy) + sum(1 for slot in self._busy if slot.following)

    def running_queues(self) -> Counter[str]:
        """Running jobs per queue name."""
        with self._cond:
            return Counter(running.row.queue for running in self._busy.values())

    def held(self) -> frozenset[Any]:
        """Ids of the rows running and taken to run next, under ``_cond`` (a thread takes
        its next row from the prefetch buffer under it)."""
        with self._cond:
            return frozenset([*(running.row.id for running in self._busy.values()),
                              *(slot.following.id for slot in self._busy
                                if slot.following is not None)])

    def submit(self, row: QueuedJob, *, then: QueuedJob | None = None) -> None:
        """Run ``row`` on an idle thread (the caller claimed at most :meth:`free` rows;
        nothing is claimed ahead here, so ``then`` is None)."""
        with self._cond:
            slot = self._idle.pop()
            self._busy[slot] = slot.running = _Running(row, time.monotonic())
            self._publish()
        slot.inbox.put(row)

    def wait(self, timeout: float) -> None:
        """Until a job ends, or ``timeout`` seconds."""
        with self._cond:
            self._cond.wait(timeout)

    def wake(self) -> None:
        """End a :meth:`wait` now (an async job ended: its slot may be claimed into)."""
        with self._cond:
            self._cond.notify_all()

    def seconds_to_next_check(self) -> float:
        """When :meth:`tick` has something to do next (a timeout or a grace period ends)."""
        now = time.monotonic()
        nearest = 1.0
        for slot in self._busy_slots():
            for limit in timeouts.thread_limits(slot.thread.ident or 0):
                due = limit.deadline + (timeouts.GRACE if limit.raised else 0.0)
                nearest = min(nearest, max(due - now, 0.01))
        return nearest

    def tick(self) -> None:
        """Enforce the running jobs' time limits: raise the timeout in a thread whose job ran
        out of time; give up a thread still in its job a grace period later. Raises
        :class:`AllThreadsStuck` when every slot's thread is stuck."""
        slots = {slot.thread.ident: slot for slot in self._busy_slots()
                 if slot.thread.ident is not None}  # (busy: started, so never None)
        timeouts.expire_thread_limits(slots)
        now = time.monotonic()
        for ident, slot in slots.items():
            for limit in timeouts.thread_limits(ident or 0):  # (an outer job's too)
                if (limit.raised and not limit.finished()
                        and now >= limit.deadline + timeouts.GRACE):
                    self._give_up(slot, limit)
                    break
        self._stuck = [slot for slot in self._stuck if slot.thread.is_alive()]
        if len(self._stuck) >= self.size:
            raise AllThreadsStuck(f"{len(self._stuck)} threads are stuck in jobs past their "
                                  f"time limits")

    # -- stopping ------------------------------------------------------------------------

    def abort(self, error: type[WorkerStoppedError] | None = None) -> None:
        """Hand every running job back to the queue (a second Ctrl-C; ``error``: the
        :class:`WorkerStoppedError` class raised in each, one taking no argument); signal-safe:
        the rows are put back by their threads, or by :meth:`shutdown` for those that do not
        stop."""
        self._aborted = True
        if error is None:  # --stop-timeout logs its own warning
            logger.warning("Worker %s got SIGINT again; stopping at once, the running jobs "
                           "go back to the queue.", self.worker.pipeline.worker_id)
        for slot in list(self._busy):
            if slot.thread.ident:  # into its job's run only, never after (Pipeline.interrupt)
                slot.pipeline.interrupt(partial(timeouts.raise_in_thread, slot.thread.ident,
                                                error or _Stopped))

    def shutdown(self) -> None:
        """Stop: let the running jobs finish (their time limits still apply), or after
        :meth:`abort` give them :data:`ABORT_GRACE` seconds and put back what still runs;
        then end the threads."""
        abort_deadline = None
        while self.busy:
            if self._aborted:
                abort_deadline = abort_deadline or time.monotonic() + ABORT_GRACE
                if time.monotonic() >= abort_deadline:
                    self._hand_back_running()
                    break
            try:
                self.tick()
            except AllThreadsStuck:
                break
            self.wait(min(self.seconds_to_next_check(), 0.5))
        with self._cond:
            self.closing = True
            slots = list(self._idle)
            self._idle.clear()
        for slot in slots:
            slot.inbox.put(None)
        for slot in slots:
            slot.thread.join(timeout=5)

    def _hand_back_running(self) -> None:
        """Put back every row still running, its attempt unused (the process exits next)."""
        with self._cond:
            running = list(self._busy.items())
            following = [slot.following for slot, _ in running if slot.following is not None]
            for slot, _ in running:
                slot.abandoned = True
                slot.following = None
                del self._busy[slot]
            self._publish()
        for row in following:
            self._give_back(row)
        completer = self.worker.pipeline.completer
        for _slot, job in running:
            if completer is not None:
                completer.take_start(job.row)
            try:
                if queue.release(job.row, count_attempt=False, wait_reason=_Stopped.detail,
                                 using=self.worker.pipeline.using):
                    logger.warning("%s [%s] goes back to the queue (worker stopped at once).",
                                   job.row.name, job.row.id)
            except (DatabaseError, InterfaceError) as exc:
                logger.warning("Could not put back %s (%s); its lease will bring it back.",
                               job.row, exc)

    # -- inside ----------------------------------------------------------------------------

    def _busy_slots(self) -> list[_Slot]:
        with self._cond:
            return list(self._busy)

    def _finished(self, slot: _Slot, row: QueuedJob, state: str) -> QueuedJob | None:
        """A thread is done with ``row`` (called in that thread); returns the row it runs
        next, taken from the prefetch buffer (running from now on: its lease renewed as
        such), or ``None`` when it goes idle."""
        back = None
        with self._cond:
            following, slot.following = slot.following, None
            running = self._busy.get(slot)
            if running is not None and running.row is row:
                del self._busy[slot]
                now = time.monotonic()
                if self.prefetch is not None:
                    self.prefetch.finished(now - running.started)
                    if slot.abandoned or self._aborted:
                        back, following = following, None
                    elif following is None and not self._stopping():
                        following = self.prefetch.take(is_async=False)
                if following is not None:
                    self._busy[slot] = slot.running = _Running(following, now)
                elif not slot.abandoned:
                    self._idle.append(slot)
                self.worker.job_finished(state, row.queue)
                self._publish()
            elif following is not None:  # given up meanwhile: not this thread's to run
                back, following = following, None
            if following is None:
                slot.running = None
            self._cond.notify_all()
        if back is not None:
            self._give_back(back)
        return following

    def _stopping(self) -> bool:
        return self.closing or self.worker.pipeline.stopping()

    def _take_for(self, slot: _Slot) -> QueuedJob | None:
        """A buffered row for ``slot`` to run after its job (held from now on: its lease
        renewed with the running rows'), or ``None``."""
        with self._cond:
            if self.prefetch is None or slot.abandoned or self._aborted or self._stopping():
                return None
            row = self.prefetch.take(is_async=False)
            if row is not None:
                slot.following = row
                self._publish()
            return row

    def _give_back(self, row: QueuedJob) -> None:
        """Put back a row taken to run next that will not run here, its attempt unused."""
        try:
            queue.release(row, count_attempt=False, using=self.worker.pipeline.using)
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("Could not put back %s (%s); its lease will bring it back.", row,
                           exc)

    def _publish(self) -> None:
        """Tell the worker which rows run now (under ``_cond``)."""
        rows = [running.row for running in self._busy.values()]
        rows += [slot.following for slot in self._busy if slot.following is not None]
        self.worker.show_running(rows)

    def _give_up(self, slot: _Slot, limit: timeouts.ThreadLimit) -> None:
        """End the attempt of a job stuck past its timeout and the grace period, and put a
        new thread in its place (see the module docstring)."""
        with self._cond:
            running = self._busy.pop(slot, None)
            if running is None:
                return
            slot.abandoned = True
            timeouts.abandon(limit)
            self._stuck.append(slot)
            self._idle.append(_Slot(self, next(self._numbers)))
            self._publish()
            self._cond.notify_all()
        row, job = running.row, slot.pipeline.job
        logger.error("%s [%s] is still running %g s after its timeout of %g s, in code that "
                     "cannot be interrupted; its attempt ends as timed out and thread %s is "
                     "replaced (it exits when the job returns).", row.name, row.id,
                     timeouts.GRACE, limit.seconds, slot.thread.name)
        error = JobTimeoutError(f"The job has timed out after {limit.seconds:g} s (its "
                                f"thread did not stop; it was given up).")
        main = self.worker.pipeline
        try:
            if job is None or job.context.job_id != str(row.id):
                raise RuntimeError("the stuck thread's job is not known")  # never expected
            outcome = main.after_exception(row, job, error)
            self.worker.job_finished(main.apply(row, job, outcome, running.started), row.queue)
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("Could not end the attempt of %s (%s); its lease will bring it "
                           "back.", row, exc)
        except Exception as exc:
            logger.exception("Could not end the attempt of %s; its lease will bring it back.",
                             row, exc_info=exc)
