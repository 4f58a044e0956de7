"""``ThrottlesExceptions``: a circuit breaker around jobs that call a flaky service.

Exceptions count against a key (default: the job's name). Below ``max_attempts`` a failed job
goes back to the queue after ``backoff`` seconds (that run counted as one of its tries). At
``max_attempts`` failures within ``decay_seconds`` the circuit opens: jobs on the key are
deferred, without using tries, until ``decay_seconds`` have passed. Then exactly one job runs
as a probe (half-open): its real success closes the circuit, its failure opens it again. Only a
real success resets the count: a job that was released, deferred or dropped leaves the circuit
as it was (Laravel clears it then, PR #61293). A ``StoreUnavailableError`` (a lock or counter
store that cannot be reached) is not the service failing, nor is a worker's stop
(``WorkerStoppedError``): neither is ever counted or dropped by ``delete_when``; each goes to
the worker as it is. A timeout is an exception here for an async job too (its task cancelled:
counted, or dropped by ``delete_when``, as a sync job's ``JobTimeoutError``); an operator's
cancel or a worker's stop of an async job is neither (nor a success when the job catches
its ``CancelledError`` and returns, nor a failure when it raises another exception instead).
A store outage while a stop or a timeout is recorded is logged; the stop or timeout reaches
the worker as it is.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_jobguard import aio, clock, durations, keys
from django_jobguard.exceptions import (
    JobCancelledError,
    JobTimeoutError,
    StoreUnavailableError,
    WorkerStoppedError,
)
from django_jobguard.limits import UnknownLimiterError
from django_jobguard.middleware import JobMiddleware, Next
from django_jobguard.outcome import Kind, Outcome
from django_jobguard.stores import counters, get_store

if TYPE_CHECKING:
    from django_jobguard.context import JobLike

logger = logging.getLogger("django_jobguard.limits")

#: The exception an async job's run cut short for ``reason`` ends with (``aio._result``), as
#: a sync job's would: a stop, or a task cancelled for no reason, is a ``WorkerStoppedError``.
_CUT_SHORT_ENDS_WITH: dict[str | None, type[Exception]] = {
    aio.TIMEOUT: JobTimeoutError, aio.CANCELLED: JobCancelledError}

ExceptionFilter = type[BaseException] | tuple[type[BaseException], ...] | Callable[
    [BaseException], Any]


def _matcher(value: ExceptionFilter | None, what: str) -> Callable[[BaseException], bool] | None:
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, BaseException) or (
            isinstance(value, tuple) and value
            and all(isinstance(v, type) and issubclass(v, BaseException) for v in value)):
        return lambda exc: isinstance(exc, value)
    if callable(value):
        predicate: Callable[[BaseException], Any] = value
        return lambda exc: bool(predicate(exc))
    raise TypeError(f"ThrottlesExceptions({what}=...) takes an exception class, a tuple of "
                    f"them or a callable(exception), not {value!r}.")


class ThrottlesExceptions(JobMiddleware):
    """Open a circuit on ``max_attempts`` exceptions within ``decay_seconds``.

    ``backoff``: seconds before a job whose exception was counted runs again.
    ``by`` / ``.by(key)``: share the circuit across job classes (a string, or a function of the
    job). ``by_job``: one circuit per queued job instead of per job class.
    ``when``: only exceptions it accepts count; others reach the worker untouched (normal
    retry / failure by ``tries``). ``delete_when``: drop the job on these (deleted, not
    failed, not retried, not counted: ``SKIPPED``; checked first), its timeout
    (``JobTimeoutError``) too, sync or async. Both take an exception class, a tuple of them
    or a predicate.
    ``report``: ``True`` logs each counted exception; a callable(exception) reports it (e.g.
    ``sentry_sdk.capture_exception``).
    ``store``: the store alias holding the circuit (default ``JOBGUARD['STORE']``).
    """

    def __init__(self, max_attempts: int = 10, decay_seconds: float = 600, backoff: float = 0,
                 *, by: str | Callable[[JobLike], Any] | None = None, by_job: bool = False,
                 when: ExceptionFilter | None = None,
                 delete_when: ExceptionFilter | None = None,
                 report: bool | Callable[[BaseException], Any] | None = None,
                 store: str | None = None) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) \
                or max_attempts < 1:
            raise ValueError(f"max_attempts must be a whole number of at least 1, not "
                             f"{max_attempts!r}.")
        if not isinstance(decay_seconds, (int, float)) or not decay_seconds > 0:
            raise ValueError(f"decay_seconds must be a positive number, not {decay_seconds!r}.")
        if not isinstance(backoff, (int, float)) or backoff < 0:
            raise ValueError(f"backoff must be a number of seconds >= 0, not {backoff!r}.")
        if by is not None and by_job:
            raise ValueError("ThrottlesExceptions takes by= or by_job=True, not both.")
        if report is not None and not isinstance(report, bool) and not callable(report):
            raise TypeError(f"report must be True or a callable(exception), not {report!r}.")
        self.max_attempts = max_attempts
        self.decay_seconds = float(decay_seconds)
        self.backoff = float(backoff)
        self.key = by
        self.by_job = by_job
        self.when = _matcher(when, "when")
        self.delete_when = _matcher(delete_when, "delete_when")
        self.report = report
        self.store = store

    def by(self, key: str | Callable[[JobLike], Any]) -> ThrottlesExceptions:
        """Share one circuit under ``key`` across every job that uses it (chainable)."""
        if self.by_job:
            raise ValueError("ThrottlesExceptions takes by= or by_job=True, not both.")
        self.key = key
        return self

    def __repr__(self) -> str:
        return (f"ThrottlesExceptions({self.max_attempts}, {self.decay_seconds:g}"
                + (f", by={self.key!r}" if self.key is not None else "") + ")")

    def circuit_key(self, job: JobLike) -> str:
        if self.key is not None:
            return keys.circuit(self.key(job) if callable(self.key) else self.key)
        if self.by_job:
            return keys.circuit(job.name, job.job_id or id(job))
        return keys.circuit(job.name)

    def probe_lease(self, job: JobLike) -> float:
        """How long the probe holds the half-open circuit before another job may probe: the
        decay, or the run's timeout if longer (a slow probe is not doubled)."""
        return max(self.decay_seconds, job.context.policy.timeout)

    def handle(self, job: JobLike, next: Next) -> Any:
        circuit = self.enter(job)
        if circuit is None:
            return None
        try:
            result = next(job)
        except Exception as exc:
            self.failed(job, circuit, exc)  # raises it again, or returns: handled
            return None
        self.succeeded(job, circuit)
        return result

    async def ahandle(self, job: JobLike, next: Next) -> Any:
        """``handle()`` for an async job (the circuit is read and written off the loop). A
        job cancelled (its timeout, a cancel, a stop) while it enters the circuit leaves it
        as it was once entered (:func:`aio.acquire_sync`): a probe it was admitted as is
        freed, not held until its lease runs out."""
        circuit = await aio.acquire_sync(self.enter, self.abandoned, job)
        if circuit is None:
            return None
        try:
            result = await next(job)
        except Exception as exc:
            if job.context.cut_short is not None:  # its cancellation, turned into another
                # exception by the job: the worker ends the run as cut short, so does this
                await self._acut_short(job, circuit, job.context.cut_short)
                raise
            await aio.call_sync(self.failed, job, circuit, exc)
            return None
        except asyncio.CancelledError:
            # Its timeout is counted (or the job dropped by delete_when) as a sync job's
            # JobTimeoutError is; a cancel or a stop leaves the circuit as it was (a probe
            # freed), not held until its lease runs out. The cancellation goes on either way:
            # the worker ends the run, honouring a drop asked for on its timeout.
            await self._acut_short(job, circuit, job.context.cut_short)
            raise
        reason = job.context.cut_short
        if reason is not None:
            # It caught its cancellation and returned: the worker still ends the run as cut
            # short (aio.run_job), and so does the circuit, which must not see a success.
            # (Read from the run's context, not the task: the task is forgotten once the
            # grace period ran out, and a sync middleware around this one runs it in
            # another task.)
            await self._acut_short(job, circuit, reason)
            return result
        await aio.call_sync(self.succeeded, job, circuit)
        return result

    async def _acut_short(self, job: JobLike, circuit: dict[str, Any],
                          reason: str | None) -> None:
        """:meth:`cut_short` off the loop; what it raises is logged: the run ends by its
        cancellation whatever the circuit could record. A store outage is logged as the sync
        paths log it (:meth:`_unrecorded`, one warning line naming the exception the run
        ends with), anything else with its traceback."""
        try:
            await aio.call_sync(self.cut_short, job, circuit, reason)
        except StoreUnavailableError as outage:
            ends_with = _CUT_SHORT_ENDS_WITH.get(reason, WorkerStoppedError)
            self._unrecorded(job, circuit, f"ended with {ends_with.__name__}", outage)
        except Exception:
            logger.exception("%s [%s]: could not leave circuit %s as it was cancelled.",
                             job.name, job.job_id, circuit["key"])

    def cut_short(self, job: JobLike, circuit: dict[str, Any], reason: str | None) -> None:
        """An async job's task was cancelled in ``handle()`` (whether the cancellation went
        on or the job caught it and returned: the run ends cut short either way): ``reason``
        :data:`aio.TIMEOUT` is what a sync job's timeout is (a failure when counted, a drop
        asked for when ``delete_when`` takes it), anything else neutral and never a drop. A
        timeout an inner middleware dropped the job for is neutral here too: a sync job's
        inner middleware swallows it, and this one sees a run that was not a success."""
        requested = job.context.requested
        if reason != aio.TIMEOUT or (requested is not None
                                     and requested.kind is Kind.DROPPED):
            self.abandoned(circuit)
            return
        timeout = job.context.policy.timeout
        try:
            self.failed(job, circuit, JobTimeoutError(
                f"The job has timed out after {timeout:g} s."))
        except JobTimeoutError:
            pass  # the worker ends it by its timeout rules, as it does already

    def enter(self, job: JobLike) -> dict[str, Any] | None:
        """Enter the circuit; ``None`` after deferring the job (the circuit is open)."""
        store = get_store(self.store)
        key = self.circuit_key(job)
        owner = job.job_id or uuid.uuid4().hex
        settings: dict[str, Any] = {"max_attempts": self.max_attempts,
                                    "decay": self.decay_seconds}
        entry = store.circuit_enter(key, owner=owner, probe_lease=self.probe_lease(job),
                                    **settings)
        if not entry.admitted:
            job.defer(self._wait(entry), reason="circuit_open",
                      detail=f"circuit {keys.label(key)!r} was open")
            return None
        return {"store": store, "key": key, "owner": owner, "settings": settings}

    def abandoned(self, circuit: dict[str, Any]) -> None:
        """Leave a circuit entered for a run that never started (its job's task was
        cancelled meanwhile): neutral, the probe freed if it was one."""
        circuit["store"].circuit_leave(circuit["key"], owner=circuit["owner"],
                                       outcome=counters.NEUTRAL, **circuit["settings"])

    def failed(self, job: JobLike, circuit: dict[str, Any], exc: Exception) -> None:
        """Record ``exc`` in the circuit; raises it again unless it was handled here (the
        job then goes back, or is dropped: asked for as an outcome, which the worker also
        honours after an async job's timeout, whose cancellation is never swallowed)."""
        store, key, owner, settings = (circuit["store"], circuit["key"], circuit["owner"],
                                       circuit["settings"])
        if isinstance(exc, (StoreUnavailableError, WorkerStoppedError)):
            # jobguard's own infrastructure, not the service: the worker decides (before
            # handle() it puts the job back without using an attempt). A stop raised into a
            # sync job (a second Ctrl-C, --reload past its grace, an iterable job's lost
            # lease) is neither counted nor dropped, as an async job's stop (cut_short). An
            # outage of the circuit's store must not replace it: the stop goes on (so does
            # an outage raised before handle(), which the worker tells by handle_started).
            try:
                self.abandoned(circuit)
            except StoreUnavailableError as outage:
                self._unrecorded(job, circuit, f"ended with {type(exc).__name__}", outage)
            raise exc
        counted = self._counts(exc)
        try:
            decision = store.circuit_leave(
                key, owner=owner, **settings,
                outcome=counters.FAILURE if counted else counters.NEUTRAL)
        except StoreUnavailableError as outage:
            if not isinstance(exc, JobTimeoutError):
                raise  # the job's exception now, as any outage after handle() started
            # A timeout still reaches the worker as one (its timeout rules, fail_on_timeout),
            # or the drop delete_when asks for below: the outage is only logged. (A timeout
            # is never released here, so its decision is not needed.)
            self._unrecorded(job, circuit, f"ended with {type(exc).__name__}", outage)
            decision = None
        if self.delete_when is not None and self.delete_when(exc):
            logger.info("%s [%s] dropped on %r.", job.name, job.job_id, exc)
            job.context.request(Outcome.dropped(
                "delete_when", detail=f"delete_when matched {type(exc).__name__}"))
            return
        if not counted:
            raise exc
        self._report(job, exc)
        context = job.context
        if isinstance(exc, JobTimeoutError) or context.policy.is_last_attempt(
                context.attempt, clock.now()):
            raise exc  # the worker fails it with the real exception (or its timeout rules)
        # A counted exception puts the job back as a retry: the run used its attempt, and
        # the exception is its last error, but it does not count towards max_exceptions
        # (the middleware handled it).
        job.context.request(Outcome.released(
            durations.due(self.backoff), reason="released", exception=exc,
            counts_exception=False, detail=f"counted by circuit {keys.label(key)!r}: "
            f"{decision.failures} of {self.max_attempts} failures"
            + (", now open" if decision.state == counters.OPEN else "")))

    @staticmethod
    def _unrecorded(job: JobLike, circuit: dict[str, Any], ended: str,
                    outage: StoreUnavailableError) -> None:
        """Log that the circuit's store could not record how the run ``ended`` (finished, or
        ended with a stop or a timeout), which stands as it is."""
        logger.warning("%s [%s] %s, but circuit %s could not record it (%s).",
                       job.name, job.job_id, ended, circuit["key"], outage)

    def succeeded(self, job: JobLike, circuit: dict[str, Any]) -> None:
        """Record the end of a run that raised nothing (only a real success closes it)."""
        outcome = counters.SUCCESS if job.context.really_succeeded else counters.NEUTRAL
        try:
            circuit["store"].circuit_leave(circuit["key"], owner=circuit["owner"],
                                           outcome=outcome, **circuit["settings"])
        except StoreUnavailableError as outage:
            # handle() has run: its outcome stands. Raising here would run it again. The
            # circuit keeps its count (or its probe lease runs out) until the store is back.
            self._unrecorded(job, circuit, "finished", outage)

    def _counts(self, exc: BaseException) -> bool:
        if isinstance(exc, UnknownLimiterError):  # a configuration error, not a failing service
            return False
        if self.delete_when is not None and self.delete_when(exc):
            return False
        return self.when is None or self.when(exc)

    def _wait(self, entry: Any) -> float:
        """Until the circuit may close; while a probe runs, ask again every tenth of the decay
        (at least 0.5 s) rather than waiting out the probe's whole lease."""
        wait = entry.retry_after
        if entry.state == counters.HALF_OPEN:
            wait = min(wait, max(0.5, self.decay_seconds / 10))
        return wait + random.uniform(0, min(1.0, self.decay_seconds / 10))

    def _report(self, job: JobLike, exc: BaseException) -> None:
        if not self.report:
            return
        if callable(self.report) and not isinstance(self.report, bool):
            try:
                self.report(exc)
            except Exception:
                logger.exception("The report callback of ThrottlesExceptions raised.")
            return
        logger.warning("%s [%s] raised %r (counted by ThrottlesExceptions %s).", job.name,
                       job.job_id, exc, self.circuit_key(job),
                       exc_info=(type(exc), exc, exc.__traceback__))
