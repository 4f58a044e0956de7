"""One claimed job, top to bottom: rebuild it, run it, decide its outcome, apply the outcome.

:meth:`Pipeline.process` is the whole path of one row:

0. **start** it: a row claimed ahead counts its attempt now (the claim counted it for a row
   started at once), so a job its worker never began has not used a try;
1. **rebuild** the job from its row: the registered class, the envelope decoded once, the
   arguments (an unknown name, a corrupt payload or a missing model → failed, or deleted with
   ``delete_when_missing_models``), and its :class:`~django_jobguard.context.JobContext`;
2. **fail** it if it already used its attempts (or its ``retry_until`` passed);
3. **run** middleware and ``handle()`` under the job's timeout (a
   ``ShouldBeUniqueUntilProcessing`` lock is released once every middleware let the job
   through, just before ``handle()``) and decide the :class:`~django_jobguard.outcome.Outcome`;
4. **apply** it: ack (and release the unique lock), put the row back (a release, a deferral,
   a store outage before ``handle()``, an exception with tries left), or move it to failed
   jobs. Every write is owner-checked: a worker that lost its lease logs LOST and changes
   nothing.

An async job (``async def handle()``) takes the same path, its step 3 on the event loop
(:mod:`django_jobguard.aio`): :meth:`Pipeline.process` waits for it there, while the
worker's async executor runs :meth:`Pipeline.begin` (0–2) in its coordinator and
:meth:`Pipeline.acomplete` (3–4) on the loop, step 4 off the loop.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Final

from django.db import DatabaseError, InterfaceError, connections, transaction
from django.utils import timezone

from django_jobguard import (
    aio,
    clock,
    queue,
    registry,
    results,
    serialization,
    signals,
    tracing,
    unique_jobs,
    workflows,
)
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.context import JobContext
from django_jobguard.durations import Due
from django_jobguard.envelope import Envelope, encoded_size, unique_ref
from django_jobguard.exceptions import (
    JobCancelledError,
    JobTimeoutError,
    MaxAttemptsExceededError,
    PayloadError,
    PoisonRowError,
    StoreUnavailableError,
    WorkerStoppedError,
    describe,
    error_text,
    short_error,
)
from django_jobguard.logs import text_line
from django_jobguard.middleware.chain import run_middleware, run_middleware_async
from django_jobguard.observe import job_line, running
from django_jobguard.outcome import JobState, Kind, Outcome
from django_jobguard.progress import RunReporter
from django_jobguard.retry import Defaults, RetryPolicy
from django_jobguard.serialization import MissingModelError
from django_jobguard.worker import timeouts
from django_jobguard.worker.completer import GROUPED, Completer, Finished
from django_jobguard.worker.timeouts import ThreadTimeoutError, time_limit

if TYPE_CHECKING:
    from django_jobguard.context import JobLike
    from django_jobguard.models import QueuedJob

logger = logging.getLogger("django_jobguard.worker")

#: A job stopped by a store outage before ``handle()`` comes back after this many seconds, plus
#: up to ``STORE_OUTAGE_JITTER`` (so that the jobs put back together do not all return at once).
STORE_OUTAGE_DELAY = 2.0
STORE_OUTAGE_JITTER = 3.0
#: Seconds the worker then waits before its next job, so it does not spin through the queue
#: putting back job after job while the store restarts.
STORE_OUTAGE_PAUSE = 1.0

MISSING_MODEL = "missing_model"

Log = Callable[[str, str], None]


class Pipeline:
    """Processes claimed rows for the worker ``worker_id`` (see the module docstring)."""

    def __init__(self, *, worker_id: str, using: str | None = None,
                 defaults: Defaults | None = None, log: Log | None = None,
                 log_running: bool = True,
                 pause: Callable[[float], Any] = time.sleep,
                 event_loop: bool = False) -> None:
        self.worker_id = worker_id
        self.using = queue_database(using)
        self.defaults = defaults or Defaults()
        #: Called with each job line's text and state, besides the ``logging`` record
        #: (:mod:`~django_jobguard.logs`): in-process callers collecting outcomes.
        self.log = log
        # Whether RUNNING lines are wanted: the line is not even built otherwise.
        self.log_running = log_running
        self.pause = pause
        #: Run async jobs on this process's event loop thread (a worker), not on a loop of
        #: their own in this thread (``drain()``, inline mode).
        self.event_loop = event_loop
        #: Arm the watchdog's hard limit for async jobs too (a jobworker process; sync jobs
        #: get it from :func:`~django_jobguard.worker.timeouts.time_limit`).
        self.hard_limits = False
        #: The context of the job whose middleware and ``handle()`` run now (else ``None``).
        self.running: JobContext | None = None
        #: Held to raise an exception into this pipeline's thread (:meth:`interrupt`), and by
        #: that thread as its job's run ends (reentrant: a signal handler may ask again).
        self._interrupting = threading.RLock()
        #: That job (an executor ends its attempt when its thread is stuck past its timeout).
        self.job: JobLike | None = None
        #: Whether the worker is stopping gracefully: what ``job.stopping`` reads.
        self.stopping: Callable[[], bool] = _never
        #: The worker's completion group (``COMPLETION_WINDOW``), else ``None``: one ack
        #: per job (:mod:`~django_jobguard.worker.completer`).
        self.completer: Completer | None = None
        #: Called with each row acked in a group and its state, once the group committed
        #: (the worker counts it; :meth:`process` returned :data:`GROUPED` for it).
        self.grouped_done: Callable[[QueuedJob, str], None] = _ignore
        #: A thread of ``--threads``: the row it runs next, taken from the prefetch buffer
        #: as a job's outcome is written, so that its ack also starts that row (one round
        #: trip, as the solo executor's ``then``); ``None`` when there is none.
        self.next_row: Callable[[], QueuedJob | None] | None = None
        #: Async rows begun by :meth:`_begin_next`, by id: the job (or the state that ended
        #: it) and when it started; :meth:`aprocess` takes its row's out.
        self._begun: dict[Any, tuple[str | JobLike, float]] = {}

    def interruptible(self) -> JobContext | None:
        """The running job's context while an exception raised into it still ends the run
        (not once ``handle()`` has finished: its middleware's clean-up must go on)."""
        running = self.running
        return running if running is not None and not running.handle_finished else None

    def interrupt(self, raise_in_thread: Callable[[], object]) -> bool:
        """From another thread: call ``raise_in_thread()`` (it raises an exception into this
        pipeline's thread) if its job is :meth:`interruptible`; whether it did. The run ends
        under the same lock (:meth:`_run_ended`), so the exception lands in the run and is
        its outcome (the job goes back), never after it: not in the writes of that outcome,
        nor in a completion group the thread then writes for other jobs (their unique locks
        would stay taken, their signals unsent, their attempts miscounted)."""
        with self._interrupting:
            if self.interruptible() is None:
                return False
            raise_in_thread()
            return True

    def process(self, row: QueuedJob, *, then: QueuedJob | None = None) -> str:
        """Run one claimed row to its outcome; returns the state logged (DONE, FAILED, …).

        ``then`` is the row claimed ahead that runs next: its ack starts it (one round trip).
        A row the worker cannot take to an outcome (an error outside the job's own code that
        is not a database or store outage) is failed with that error, once, instead of being
        claimed again every lease for ever."""
        started = time.monotonic()
        with running(row, self.worker_id):  # the trace span, when tracing is on
            if not self._start(row):  # one claimed ahead counts it now
                return self._lost(row, started)
            job = None
            try:
                job = self._prepare(row, started, then)
                if isinstance(job, str):
                    return job
                return self.apply(row, job, self.run(row, job), started, then=then)
            except (DatabaseError, InterfaceError, StoreUnavailableError, ThreadTimeoutError,
                    WorkerStoppedError):
                # Transient: the row's lease runs out and it is retried. (A timeout or stop
                # here was raised into a worker thread just as its job left handle().)
                raise
            except Exception as exc:
                return self._unprocessable(row, exc, started)
            finally:
                if job is not None and not isinstance(job, str):
                    job.context.close_reporter()

    async def aprocess(self, row: QueuedJob, *,
                       then: Callable[[], QueuedJob | None] | None = None) -> str:
        """:meth:`process` for an async job's row, on the event loop: the database work off
        the loop (:func:`aio.call_sync`), the job on it, so that many async jobs wait at
        once without a thread each (``then``: as for :meth:`acomplete`)."""
        begun = self._begun.pop(row.id, None)
        if begun is not None:  # begun in the hop that wrote the outcome of the job before
            job, started = begun
            if isinstance(job, str):
                return job
            return await self.acomplete(row, job, started, then=then)
        started = time.monotonic()
        with running(row, self.worker_id):  # the trace span, when tracing is on
            on_loop = self.begin_on_loop(row, started)
            if on_loop is None or on_loop is STARTED:  # it needs the database: off the loop
                job = await aio.call_sync(self.begin, row, started,
                                          counted=on_loop is STARTED)
                if isinstance(job, str):
                    return job
            else:
                job = on_loop
            return await self.acomplete(row, job, started, then=then)

    async def acomplete(self, row: QueuedJob, job: JobLike, started: float, *,
                        then: Callable[[], QueuedJob | None] | None = None) -> str:
        """On the event loop: run the job :meth:`begin` returned, then apply its outcome
        off the loop (one round trip to a thread). ``then()``, asked as the outcome is
        written, gives the row that runs next in this job's slot (the prefetch buffer's),
        which its ack starts in the same round trip."""
        try:
            began = time.monotonic()
            try:
                result: Any = await self.run_on_loop(row, job)
                error: BaseException | None = None
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                result, error = None, exc
            ran = time.monotonic() - began
            if error is not None:  # perhaps a connection of the job's async ORM broke: drop
                await aio.reset_job_connections()  # it before the retry can be claimed
            else:
                grouped = self._group_on_loop(row, job, result, started, ran)
                if grouped is not None:
                    return grouped
            return await aio.call_sync(self._finish, row, job, result, error, started, then,
                                       ran)
        finally:
            job.context.close_reporter()

    def begin(self, row: QueuedJob, started: float, *, counted: bool = False
              ) -> str | JobLike:
        """Off the loop (any thread): start and rebuild an async job's row; its state if
        that ended it, else the job (announced as running) for :meth:`acomplete`.
        ``counted``: its start was taken care of already (:meth:`begin_on_loop`)."""
        if not counted and not self._start(row):
            return self._lost(row, started)
        job = None
        try:
            job = self._prepare(row, started, None)
            if not isinstance(job, str):
                self._starting(row, job)
            return job
        except (DatabaseError, InterfaceError, StoreUnavailableError):
            raise
        except Exception as exc:
            if job is not None and not isinstance(job, str):
                job.context.close_reporter()
            return self._unprocessable(row, exc, started)

    def begin_on_loop(self, row: QueuedJob, started: float) -> JobLike | Begun | None:
        """On the worker's event loop: :meth:`begin` without a hop to a thread, for a row
        that needs no statement to start and rebuild: its attempt counted by its claim or
        deferred to the completion group, no model arguments, no chain or batch, no cancel
        asked, attempts left, no ``job_processing`` receiver (it may use the ORM). ``None``
        (nothing done) or :data:`STARTED` (its start is done) when the rest must run off
        the loop, where the ORM may be used: :meth:`begin`, with ``counted``."""
        if not self._loop_may_begin(row):
            return None
        completer = self.completer
        if queue.claimed_ahead(row) and (completer is None or not completer.defer(row)):
            return None
        try:
            job = self.rebuild(row)
        except Exception:  # e.g. the job's constructor used the ORM: all again off the loop
            return STARTED
        if job.context.policy.out_of_attempts(row.attempts):
            job.context.close_reporter()
            return STARTED  # failed off the loop
        self._starting(row, job)
        return job

    def _loop_may_begin(self, row: QueuedJob) -> bool:
        """Whether rebuilding ``row`` and announcing it runs no statement (see
        :meth:`begin_on_loop`), asked before anything is done."""
        if not aio.on_worker_loop() or signals.job_processing.receivers:
            return False
        if (row.cancel_requested_at is not None or queue.poison(row)
                or workflows.involved(row.payload)):
            return False
        payload = row.payload
        if not isinstance(payload, dict) or serialization.references_models(
                (payload.get("args"), payload.get("kwargs"))):
            return False
        try:
            job_class = registry.get(row.name)
        except registry.UnknownJobError:
            return False
        return _rebuilt_from_arguments(job_class)

    def _group_on_loop(self, row: QueuedJob, job: JobLike, result: Any, started: float,
                       ran: float) -> str | None:
        """On the worker's event loop, an async job that returned: its ack joined to the
        completion group without a hop to a thread, when :meth:`apply` would only do that
        (done or skipped, no result kept, no chain or batch, its start deferred); its DONE
        line comes once the group is written, off the loop. ``None``: :meth:`_finish`."""
        completer = self.completer
        if completer is None or not aio.on_worker_loop():
            return None
        outcome = self._outcome(row, job, result)
        if not _may_group(row, job, outcome):
            return None
        completer.ran(row.name, ran)  # (apply() sets it again if the group does not take it)
        if not completer.join(Finished(row, job, outcome, time.monotonic() - started,
                                       acked=self._group_acked, lost=self._group_lost),
                              write=False):
            return None
        return GROUPED

    def _finish(self, row: QueuedJob, job: JobLike, result: Any, error: BaseException | None,
                started: float, then: Callable[[], QueuedJob | None] | None = None,
                ran: float | None = None) -> str:
        """Off the loop: the outcome of an async job's run, applied (``then``: see
        :meth:`acomplete`; ``ran``: seconds the job itself ran on the loop)."""
        following = None
        try:
            outcome = self._outcome(row, job, result) if error is None else \
                self._error_outcome(row, job, error)
            following = then() if then is not None else None
            state = self.apply(row, job, outcome, started, then=following, ran=ran)
        except (DatabaseError, InterfaceError, StoreUnavailableError):
            raise
        except Exception as exc:
            return self._unprocessable(row, exc, started)
        if following is not None:
            self._begin_next(following)
        return state

    def _begin_next(self, row: QueuedJob) -> None:
        """In the pool thread that wrote an async job's outcome: start and rebuild ``row``,
        the row that takes its slot (:meth:`aprocess` then runs it at once: one hop to a
        thread per job, not two). Not under tracing (its rebuild belongs in the row's own
        run span), nor after an error: :meth:`aprocess` begins it again then."""
        if tracing.tracer() is not None:
            return
        started = time.monotonic()
        try:
            self._begun[row.id] = (self.begin(row, started), started)
        except Exception as exc:
            logger.debug("Beginning %s after the job before it failed (%s); it begins on "
                         "its own.", row, exc)

    def _start(self, row: QueuedJob) -> bool:
        """Count the attempt of a row claimed ahead as it starts (:func:`queue.start`), or
        leave that to the completion group; False if the worker no longer holds it."""
        if self.completer is not None:
            return self.completer.start(row)
        return queue.start(row, using=self.using)

    def _per_job(self, row: QueuedJob) -> None:
        """Before a write of ``row``'s own: its start leaves the completion group."""
        if self.completer is not None:
            self.completer.take_start(row)

    def _unprocessable(self, row: QueuedJob, exc: Exception, started: float) -> str:
        """Fail ``row`` with ``exc`` if it is still ours (nothing was applied yet); otherwise
        the error came after its outcome was written (a signal receiver) and is raised."""
        self._per_job(row)
        logger.error("%s [%s] could not be processed: %s", _shown(row), row.id,
                     describe(exc), exc_info=(type(exc), exc, exc.__traceback__))
        try:
            with transaction.atomic(using=self.using):
                failed = queue.fail(row, exc, reason="the worker could not process this row: "
                                    + describe(exc), using=self.using)
        except (DatabaseError, InterfaceError):
            failed = None
        if failed is None:
            raise exc
        unique_jobs.release(unique_ref(row.payload))
        signals.job_failed.send(sender=None, job=None, job_id=str(row.id), exception=exc)
        return self._log(row, JobState.FAILED, started, describe(exc))

    def _prepare(self, row: QueuedJob, started: float,
                 then: QueuedJob | None) -> str | JobLike:
        """Rebuild the started row's job and check it may run: the job, or the state it
        ended in (failed, deleted, cancelled, put back) when it may not."""
        try:
            job = self.rebuild(row)
        except registry.UnknownJobError as exc:
            return self._unknown(row, exc, started)
        except MissingModelError as exc:
            if getattr(registry.get(row.name), "delete_when_missing_models", False):
                return self.apply(row, None, Outcome.dropped(MISSING_MODEL), started,
                                  detail=str(exc), then=then)
            return self.apply(row, None, Outcome.failed(
                exc, reason="rebuild", detail="a model argument no longer exists"), started)
        except Exception as exc:
            return self.apply(row, None, Outcome.failed(
                exc, reason="rebuild", detail=_unbuildable(exc)), started)
        try:
            ended = self._refused(row, job, started)
        except BaseException:
            job.context.close_reporter()
            raise
        if ended is not None:
            job.context.close_reporter()
            return ended
        return job

    def _refused(self, row: QueuedJob, job: JobLike, started: float) -> str | None:
        """The state of a job that may not run (cancelled, its batch cancelled, out of
        attempts), written; ``None`` when it may."""
        if row.cancel_requested_at is not None:  # cancelled while it ran, then put back
            return self.apply(row, job, Outcome.cancelled(), started)
        skip = workflows.skip_reason(row.payload, using=self.using)
        if skip:  # e.g. its batch was cancelled
            return self.apply(row, job, Outcome.cancelled(skip), started)
        ended = job.context.policy.out_of_attempts(row.attempts)
        if ended:
            if row.wait_reason:
                ended += f" while {row.wait_reason}"
            error = MaxAttemptsExceededError(
                f"{_shown(row)} has been attempted too many times: {ended}"
                + (f"; last error: {short_error(row.last_error)}" if row.last_error else "")
                + ".")
            return self.apply(row, job, Outcome.failed(error, reason="attempts", detail=ended),
                              started)
        return None

    def _unknown(self, row: QueuedJob, exc: registry.UnknownJobError, started: float) -> str:
        """A job this worker does not know: put back with back-off while it is younger than
        ``UNKNOWN_JOB_GRACE`` (a newer worker of a rolling deploy may know it), without using
        an attempt; failed after that, naming both causes."""
        grace = float(jobguard_settings.UNKNOWN_JOB_GRACE or 0)
        age = (timezone.now() - row.created_at).total_seconds() if row.created_at else grace
        incompatible = isinstance(exc, registry.IncompatibleJobError)
        if age < grace:
            # 1 s at first, then half the row's age (60 s at most), never past the grace.
            delay = max(0.5, min(grace - age, 60.0, max(1.0, age / 2)))
            self._per_job(row)
            why = (f"worker {self.worker_id} cannot rebuild it ({str(exc).partition(': ')[2]})"
                   if incompatible else f"its job is not registered in worker {self.worker_id}")
            if not queue.release(row, due=Due(delay=delay), count_attempt=False,
                                 wait_reason=why[:255], using=self.using):
                return self._lost(row, started)
            logger.warning("%s [%s] %s; put back for %.1f s (UNKNOWN_JOB_GRACE: %g s left).",
                           row.name, row.id,
                           "cannot be rebuilt by this worker's version of its class"
                           if incompatible else "is not registered in this worker",
                           delay, grace - age)
            return self._log(row, JobState.RELEASED, started,
                             f"{'incompatible' if incompatible else 'unknown'} job, retry in "
                             f"{rounded(delay)} s")
        if incompatible:
            error: registry.UnknownJobError = registry.IncompatibleJobError(
                f"{exc} No worker that took it in the {grace:g} s of "
                f"JOBGUARD['UNKNOWN_JOB_GRACE'] since it was queued could rebuild it. The row "
                f"was queued by another version of {row.name} (its constructor changed): "
                f"deploy the version that takes these arguments and retry it with jobs_retry, "
                f"or keep the constructor taking the old arguments (a default for a new one) "
                f"until the old rows have run.")
            return self.apply(row, None, Outcome.failed(
                error, reason="rebuild", detail="no worker could rebuild it from its row "
                                                "during UNKNOWN_JOB_GRACE"), started)
        error = registry.UnknownJobError(
            f"No job is registered as {row.name!r} in the workers that took it in the "
            f"{grace:g} s of JOBGUARD['UNKNOWN_JOB_GRACE'] since it was queued. Either the code "
            f"that defines it is not deployed to the workers yet (a rolling deploy still "
            f"going: raise UNKNOWN_JOB_GRACE, then retry it with jobs_retry), or it is not "
            f"registered (renamed or removed, or its module is neither <app>/jobs.py nor "
            f"listed in JOBGUARD['JOB_MODULES']).{registry.did_you_mean(row.name)}")
        return self.apply(row, None, Outcome.failed(
            error, reason="rebuild", detail="its job is not registered in any worker that took "
                                            "it during UNKNOWN_JOB_GRACE"), started)

    # -- 1. rebuild ------------------------------------------------------------------------

    def rebuild(self, row: QueuedJob) -> JobLike:
        """The job of ``row`` with its context; :class:`PayloadError` (or the registry's /
        a missing model's error) when it cannot be rebuilt; :class:`PoisonRowError` for a
        poison row (see :func:`queue.poison`)."""
        problem = queue.poison(row)
        if problem:
            raise PoisonRowError(f"Quarantined {row.name} [{row.id}]: {problem}.")
        job_class = registry.get(row.name)
        try:
            envelope = Envelope.decode(row.payload)
        except PayloadError as exc:
            raise PayloadError(f"Corrupt payload for {row.name}: {exc}") from None
        self._check_size(row)
        try:
            job = job_class.from_envelope(envelope)
        except MissingModelError:
            raise
        except (TypeError, ValueError, KeyError, LookupError) as exc:
            problem = registry.signature_problem(job_class, envelope.args, envelope.kwargs
                                                 ) if isinstance(exc, TypeError) else ""
            if problem:  # queued by another version of the code: a worker that has it may
                raise registry.IncompatibleJobError(
                    f"This worker cannot rebuild {row.name} from its row: {problem}.") from exc
            raise PayloadError(f"Cannot rebuild {row.name} from its payload: {exc}") from exc
        job_id = str(row.id)
        job.context = JobContext(
            job_id=job_id, attempt=row.attempts, worker_id=self.worker_id,
            using=self.using, envelope=envelope, exceptions=row.exceptions,
            last_error=row.last_error,
            policy=RetryPolicy.for_job(job, defaults=self.defaults,
                                       retry_until=envelope.retry_until),
            reporter=RunReporter(job_id, worker_id=self.worker_id, using=self.using,
                                 claims=row.claims),
            stopping=self.stopping, claims=row.claims, checkpoint=row.checkpoint,
        )
        return job

    @staticmethod
    def _check_size(row: QueuedJob) -> None:
        """A row written around dispatch() may be over ``MAX_PAYLOAD_BYTES``. The claim knows
        the length of the stored text; encoded for the limit (UTF-8) a stored character
        takes at most 4 bytes, so only a long text needs the exact size."""
        limit = jobguard_settings.MAX_PAYLOAD_BYTES
        text_length = getattr(row, "payload_text_length", None)
        if not limit or (text_length is not None and text_length * 4 <= limit):
            return
        size = encoded_size(row.payload)
        if size > limit:
            raise PayloadError(f"Payload of {row.name} is {size} bytes, over "
                               f"JOBGUARD['MAX_PAYLOAD_BYTES'] = {limit}.")

    # -- 3. run ----------------------------------------------------------------------------

    def run(self, row: QueuedJob, job: JobLike) -> Outcome:
        """Middleware and ``handle()`` under the job's time limit, and what came of it."""
        context = job.context
        self._starting(row, job)
        try:
            self.running, self.job = context, job
            try:
                if job.is_async:
                    result = self.run_async(row, job)
                else:
                    with time_limit(context.policy.timeout,
                                    finished=lambda: context.handle_finished,
                                    label=f"{row.name} [{context.job_id}]"):
                        result = run_middleware(job)
            finally:
                self._run_ended()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            return self._error_outcome(row, job, exc)
        finally:
            self.running = self.job = None
        return self._outcome(row, job, result)

    def _run_ended(self) -> None:
        """The job's run ended: from now on :meth:`interrupt` raises nothing into this
        thread, and an exception it raised just before lands here, still in the run (CPython
        raises it after the lock's release, a call; as a timeout raised as the job leaves its
        limit lands in :func:`time_limit`)."""
        with self._interrupting:
            self.running = None

    def _starting(self, row: QueuedJob, job: JobLike) -> None:
        """Log RUNNING, send ``job_processing``, note the start time."""
        if self.log_running:
            self._log(row, JobState.RUNNING)
        if signals.job_processing.receivers:
            signals.job_processing.send(sender=type(job), job=job, job_id=job.job_id)
        job.context.started_at = clock.now()

    @staticmethod
    def _outcome(row: QueuedJob, job: JobLike, result: Any) -> Outcome:
        """What came of a run that raised nothing."""
        context = job.context
        if context.cancel_seen:
            return Outcome.cancelled()
        if context.requested is not None:
            return context.requested
        return Outcome.done(result) if context.handle_started else Outcome.dropped("skipped")

    def _error_outcome(self, row: QueuedJob, job: JobLike, exc: BaseException) -> Outcome:
        """What came of a run that raised ``exc``."""
        context = job.context
        if isinstance(exc, WorkerStoppedError):  # a second Ctrl-C, or --reload past its grace
            return Outcome.deferred(Due(delay=0), reason=exc.reason, detail=exc.detail)
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            # Raised by the job's code (the worker turns its own SIGINT/SIGTERM into a stop
            # flag, never into these): the job failed, the worker goes on.
            logger.warning("%s [%s] raised %r; treated as the job's failure, not a worker "
                           "stop.", _shown(row), row.id, exc)
            return self.after_exception(row, job, exc)
        if context.cancel_seen:  # it stopped because it was asked to
            return Outcome.cancelled()
        if isinstance(exc, StoreUnavailableError) and not context.handle_started:
            return self._store_outage(row, exc)
        return self.after_exception(row, job, exc)

    def run_async(self, row: QueuedJob, job: JobLike) -> Any:
        """An async job's middleware and ``handle()`` on an event loop, its ``timeout`` (and an
        operator's cancel) cancelling its task (:mod:`django_jobguard.aio`)."""
        return aio.run_blocking(lambda: self.run_on_loop(row, job), in_worker=self.event_loop)

    async def run_on_loop(self, row: QueuedJob, job: JobLike) -> Any:
        """On the event loop: the job's task under its time limit."""
        # (the id as the context holds it: a UUID's str() again is a cost on every job)
        timeout, label = job.context.policy.timeout, f"{row.name} [{job.context.job_id}]"
        # A jobworker's hard limit: the watchdog kills it if the run outlasts its timeout
        # (C code holding the GIL runs neither the task's cancellation nor the heartbeat).
        with timeouts.watched(timeout if self.hard_limits else 0, label):
            return await aio.run_job(job.context, run_middleware_async(job), timeout=timeout,
                                     label=label, grace=timeouts.GRACE)

    def after_exception(self, row: QueuedJob, job: JobLike, exc: BaseException) -> Outcome:
        """Retry with backoff, or fail on the last attempt / too many exceptions; a drop a
        middleware asked for as the job timed out stands (see below)."""
        context = job.context
        requested = context.requested
        if requested is not None and requested.kind is Kind.FAILED:
            return Outcome.failed(exc, reason="exception", detail=requested.detail)
        if requested is not None and requested.kind is Kind.DROPPED \
                and isinstance(exc, JobTimeoutError):
            # ThrottlesExceptions' delete_when: a sync job's middleware swallows its
            # JobTimeoutError, but an async job's timeout is its task cancelled, which must
            # end cancelled (the run raises JobTimeoutError here): its drop is asked for.
            return requested
        ending = context.policy.ends_on(
            timed_out=isinstance(exc, JobTimeoutError), attempt=context.attempt,
            exceptions=context.exceptions + 1, now=clock.now())
        if ending:
            return Outcome.failed(exc, reason="exception", detail=ending)
        logger.info("%s [%s] raised %r; retrying.", _shown(row), row.id, exc)
        return Outcome.released(Due(delay=context.policy.backoff_for(context.attempt)),
                                reason="exception", exception=exc)

    @staticmethod
    def _store_outage(row: QueuedJob, exc: StoreUnavailableError) -> Outcome:
        """A store could not be reached before ``handle()`` started: the job never ran, so
        it goes back without using an attempt (whatever ``DEFERRALS_CONSUME_ATTEMPTS`` says).
        The outage is not the job's exception: it neither counts towards ``max_exceptions``
        nor becomes ``last_error``."""
        delay = STORE_OUTAGE_DELAY + random.uniform(0, STORE_OUTAGE_JITTER)
        logger.warning("Store %r is unavailable (%s); %s [%s] goes back to the queue for "
                       "%.1f s without using an attempt.", exc.store, exc.error, _shown(row),
                       row.id, delay)
        return Outcome.deferred(Due(delay=delay), reason="store_unavailable",
                                detail=f"store {exc.store!r} was unavailable")

    # -- 4. apply --------------------------------------------------------------------------

    def apply(self, row: QueuedJob, job: JobLike | None, outcome: Outcome, started: float, *,
              detail: str = "", then: QueuedJob | None = None,
              ran: float | None = None) -> str:
        """Write ``outcome`` to the row and tell everyone; returns the state logged (an ack
        also starts ``then``, the row claimed ahead that runs next). ``ran``: how long the
        job itself ran, when not since ``started`` (an async job, whose time since then also
        holds its waits for the loop and for a thread)."""
        if then is None and self.next_row is not None:
            then = self.next_row()
        completer = self.completer
        if completer is not None:
            completer.ran(row.name, time.monotonic() - started if ran is None else ran)
            if job is not None and _may_group(row, job, outcome) and completer.join(
                    Finished(row, job, outcome, time.monotonic() - started,
                             acked=self._group_acked, lost=self._group_lost)):
                return GROUPED
            completer.take_start(row)
            if then is not None and completer.defers(then):
                then = None  # its start waits for the group too
        if outcome.kind is Kind.FAILED:
            return self._fail(row, job, outcome, started)
        if outcome.goes_back:
            assert job is not None  # only a rebuilt job is released or deferred
            state = self._put_back(row, job, outcome, started)
            if outcome.reason == "store_unavailable":
                self.pause(STORE_OUTAGE_PAUSE)
            return state
        return self._ack(row, job, outcome, started, detail=detail, then=then)

    def _ack(self, row: QueuedJob, job: JobLike | None, outcome: Outcome, started: float, *,
             detail: str = "", then: QueuedJob | None = None) -> str:
        # The result row turns SUCCESSFUL in the transaction that deletes the queue row, so
        # nobody sees the job gone from the queue while its result still says RUNNING.
        # A chain's next link is written in that transaction too; a batch member's success
        # is counted in the statement that acks it.
        keep = job is not None and job.keep_result
        cancelled = outcome.kind is Kind.CANCELLED
        batch_id = None if keep else workflows.counted_in_batch(row.payload)
        if batch_id is not None:  # a batch member: acked and counted in one statement
            acked, counts = queue.ack_counting(row, batch_id, then=then, using=self.using)
            if not acked:
                return self._lost(row, started)
            workflows.counted(batch_id, counts, using=self.using)
        elif not self._ack_with_results(row, job, outcome, keep=keep, then=then):
            return self._lost(row, started)
        unique_jobs.release(job.context.envelope.unique if job else unique_ref(row.payload))
        if job is None:  # a job deleted because a model argument is gone
            return self._log(row, JobState.DELETED, started, detail)
        if cancelled:
            return self._log(row, JobState.CANCELLED, started, outcome.detail)
        signals.job_processed.send(sender=type(job), job=job, job_id=job.job_id,
                                   result=outcome.result)
        return self._log(row, outcome.state, started, detail or outcome.detail)

    def _group_acked(self, entry: Finished) -> None:
        """After the group holding ``entry`` committed: what :meth:`_ack` does after one
        ack (the unique lock released, ``job_processed``, the job line)."""
        row, job, outcome = entry.row, entry.job, entry.outcome
        unique_jobs.release(job.context.envelope.unique)
        signals.job_processed.send(sender=type(job), job=job, job_id=job.job_id,
                                   result=outcome.result)
        state = self._log(row, outcome.state, elapsed=entry.elapsed, detail=outcome.detail)
        self.grouped_done(row, state)

    def _group_lost(self, entry: Finished) -> None:
        self._log(entry.row, JobState.LOST, elapsed=entry.elapsed,
                  detail="lease expired; another worker has it")

    def _ack_with_results(self, row: QueuedJob, job: JobLike | None, outcome: Outcome, *,
                          keep: bool, then: QueuedJob | None) -> bool:
        """Ack ``row``, in one transaction with its result (``keep``) and what its chain or
        batch does next; False if the worker no longer held it."""
        cancelled = outcome.kind is Kind.CANCELLED
        follow = workflows.involved(row.payload)
        own = not connections[self.using].in_atomic_block  # the transaction is the ack's
        with transaction.atomic(using=self.using) if keep or follow else nullcontext():
            if not queue.ack(row, then=then, using=self.using, own_transaction=own):
                return False
            context = job.context if keep and job is not None else None  # keep: a job
            if context is not None and cancelled:
                self._store_result(row, results.FAILED, context.started_at,
                                   ran=context.handle_started,
                                   exception=JobCancelledError(outcome.detail))
            elif context is not None:
                self._store_result(row, results.SUCCESSFUL, context.started_at,
                                   ran=context.handle_started, return_value=outcome.result)
            if follow:
                workflows.finished(row.payload, job_id=str(row.id), using=self.using,
                                   outcome=workflows.SKIPPED if cancelled
                                   else workflows.SUCCEEDED)
        return True

    def _put_back(self, row: QueuedJob, job: JobLike, outcome: Outcome, started: float) -> str:
        exception = outcome.exception
        if not queue.release(row, due=outcome.due, count_attempt=outcome.counts_attempt,
                             exception=exception, count_exception=outcome.counts_exception,
                             wait_reason=outcome.detail if outcome.kind is Kind.DEFERRED else "",
                             using=self.using):
            return self._lost(row, started)
        if job.keep_result:
            results.mark_ready(row, worker_id=self.worker_id, ran=job.context.handle_started,
                               exception=exception, using=self.using)
        delay = _seconds(outcome.due)
        signals.job_released.send(sender=type(job), job=job, job_id=job.job_id, delay=delay,
                                  reason=outcome.reason, exception=exception)
        said = outcome.detail if outcome.kind is Kind.RELEASED and outcome.detail else None
        return self._log(row, outcome.state, started,
                         f"{said or outcome.reason}, retry in {rounded(delay)} s")

    def _fail(self, row: QueuedJob, job: JobLike | None, outcome: Outcome,
              started: float) -> str:
        exc = outcome.exception
        assert exc is not None  # Outcome.failed always carries one
        # The job's own exception is its last error; a limit (attempts) or a row that could
        # not be rebuilt keeps the one an earlier run left on the row.
        own = outcome.reason not in ("attempts", "rebuild")
        keep = job is None or job.keep_result  # no job: a result row may exist (django.tasks)
        with transaction.atomic(using=self.using):
            if queue.fail(row, exc, reason=outcome.detail,
                          last_error=error_text(exc) if own else None,
                          using=self.using) is None:
                return self._lost(row, started)
            if keep:
                self._store_result(row, results.FAILED, None, exception=exc,
                                   ran=job is not None and job.context.handle_started,
                                   only_existing=job is None)
            workflows.finished(row.payload, outcome=workflows.FAILED, job_id=str(row.id),
                               using=self.using)
        unique_jobs.release(job.context.envelope.unique if job else unique_ref(row.payload))
        if job is not None:
            try:
                job.failed(exc)
            except Exception:
                logger.exception("%s.failed() raised.", row.name)
        signals.job_failed.send(sender=type(job) if job else None, job=job, job_id=str(row.id),
                                exception=exc)
        # An error jobguard made up (unknown job, attempts used up) has no traceback: printing
        # one would only repeat the message. The job line keeps its first sentence.
        described = describe(exc)
        logger.error("%s [%s] failed: %s", _shown(row), row.id, described,
                     exc_info=(type(exc), exc, exc.__traceback__) if exc.__traceback__ else None)
        return self._log(row, JobState.FAILED, started, brief(described))

    def lost(self, row: QueuedJob) -> str:
        """``row``, claimed ahead, was taken over before it started here (its lease ran
        out): its LOST line; it is not run."""
        return self._lost(row, time.monotonic())

    def _lost(self, row: QueuedJob, started: float) -> str:
        return self._log(row, JobState.LOST, started, "lease expired; another worker has it")

    def _store_result(self, row: QueuedJob, status: str, started_at: Any, *, ran: bool,
                      return_value: Any = None, exception: BaseException | None = None,
                      only_existing: bool = False) -> None:
        """Record the outcome in the job's result row (jobs with ``keep_result``)."""
        results.mark_finished(row, status=status, worker_id=self.worker_id, ran=ran,
                              started_at=started_at, return_value=return_value,
                              exception=exception, only_existing=only_existing,
                              using=self.using)

    # -- log lines -------------------------------------------------------------------------

    def _log(self, row: QueuedJob, state: JobState, started: float | None = None,
             detail: str = "", *, elapsed: float | None = None) -> JobState:
        """The job line of ``row``: ``logging``, metrics and trace (:mod:`.observe`)."""
        if started is not None:
            elapsed = time.monotonic() - started
        shown = _shown(row)
        job_line(self.worker_id, row, state, elapsed, detail, name=shown)
        if self.log is not None:
            self.log(text_line(timezone.localtime().strftime("%Y-%m-%d %H:%M:%S"), shown,
                               str(row.id), state, elapsed, detail), state)
        return state


def _may_group(row: QueuedJob, job: JobLike, outcome: Outcome) -> bool:
    """Whether ``outcome`` is only an ack that may join the completion group: done or
    skipped, no result kept, no chain or batch (and, asked by :meth:`Completer.join`, its
    start deferred and not written)."""
    return (outcome.kind in (Kind.DONE, Kind.DROPPED) and not job.keep_result
            and not workflows.involved(row.payload))


def _rebuilt_from_arguments(job_class: Any) -> bool:
    """Whether ``job_class`` is rebuilt by :meth:`Job.from_envelope` itself (its arguments
    decoded, its constructor called), not by a method of its own that may query."""
    global _own_from_envelope
    if _own_from_envelope is None:  # asked for every async job: the import once
        from django_jobguard.jobs import Job  # models: after app loading

        _own_from_envelope = Job.__dict__["from_envelope"].__func__
    return getattr(job_class.from_envelope, "__func__", None) is _own_from_envelope


_own_from_envelope: Any = None


class Begun(enum.Enum):
    """What :meth:`Pipeline.begin_on_loop` returns when it could not begin the job on the
    loop but did something (a marker no job state can be mistaken for)."""

    STARTED = "started"  # the row's start is done; its rebuild must run off the loop


STARTED: Final = Begun.STARTED


def _never() -> bool:
    return False


def _ignore(row: QueuedJob, state: str) -> None:
    return None


def log_finishing_error(row: QueuedJob, exc: BaseException) -> bool:
    """Log an error raised while finishing ``row`` outside its job (a job's own errors are its
    outcome). Returns True when it was not the database's: a store or a signal receiver, which
    may be restarting, so the caller backs off a second."""
    if isinstance(exc, (DatabaseError, InterfaceError)):
        logger.error("Database error while finishing %s; its lease will expire and it will be "
                     "retried.", row, exc_info=exc)
        return False
    logger.error("Error while finishing %s; if it was not acked its lease will expire and it "
                 "will be retried.", row, exc_info=exc)
    return True


def _shown(row: QueuedJob) -> str:
    """The job's name in log lines: a django.tasks task's own dotted name, not the adapter's
    (:func:`registry.display_name`)."""
    return registry.display_name(row.name, row.payload)


def rounded(seconds: float) -> str:
    """Seconds for a log line: whole from 10 s on (``63``), else to a tenth (``2.5``, ``0``)."""
    return f"{round(seconds)}" if seconds >= 10 else f"{round(seconds, 1):g}"


def brief(text: str, limit: int = 200) -> str:
    """The first sentence of ``text`` (at most ``limit`` characters) for a job line: the
    whole message is in the ``failed`` record and the failed job."""
    line = text.partition("\n")[0]
    end = line.find(". ", 40)
    if 0 < end < limit:
        line = line[:end + 1]
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _unbuildable(exc: BaseException) -> str:
    if isinstance(exc, PoisonRowError):
        return f"quarantined: {str(exc).split(': ', 1)[-1]}"
    if isinstance(exc, PayloadError):
        return "its payload could not be decoded"
    return "it could not be rebuilt from its row"


def _seconds(due: Due) -> float:
    """Seconds until ``due`` for log lines and the ``job_released`` signal (informational:
    the row itself is scheduled on the database clock)."""
    if due.at is not None:
        return max((due.at - clock.now()).total_seconds(), 0.0)
    return due.delay or 0.0

