"""How one run of a job ended: the value the pipeline decides and then applies to the row.

A run is *done* (``handle()`` returned), *dropped* (a middleware let it go without running it,
or on an exception it drops the job for: ``ThrottlesExceptions``' ``delete_when``, a timeout
included; or a model argument vanished and the job deletes itself), *released* (back to the
queue, the run counted as an attempt: ``job.release()`` or an exception with tries left),
*deferred* (back to the queue without using an attempt: an overlap lock, a full rate limit, an
open circuit, a store outage), *failed* (for good, into failed jobs) or *cancelled* (an
operator asked it to stop and it saw ``job.cancelled``, or it was cancelled before it started:
the row is deleted, no failed job is kept).

:class:`JobState` names what the job line says about a run (``RUNNING``, then one of ``DONE``,
``SKIPPED``, ``DELETED``, ``CANCELLED``, ``RELEASED``, ``FAILED``, ``LOST``): the pipeline logs
it, and history, metrics, tracing, the log palette and ``drain()`` read it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from django_jobguard.durations import NOW, Due


class JobState(enum.StrEnum):
    """A job line's state: the text the log shows, ``jobguard_jobs_total``'s ``outcome`` label
    (lowercased) and what ``Pipeline.process`` returns. Each value is its name, so a plain
    string compares and hashes equal to it (``"DONE" in JobState.finished()``)."""

    #: The run starts (logged at DEBUG; every other state ends a run).
    RUNNING = "RUNNING"
    #: ``handle()`` returned; the row is acked.
    DONE = "DONE"
    #: A middleware dropped the job: without running it (``Skip``, ``dont_release``, …), or
    #: on an exception it drops the job for (``ThrottlesExceptions``' ``delete_when``).
    SKIPPED = "SKIPPED"
    #: A model argument vanished and the job deletes itself (``delete_when_missing_models``).
    DELETED = "DELETED"
    #: An operator cancelled it; the row is deleted, no failed job is kept.
    CANCELLED = "CANCELLED"
    #: Back to the queue: released (an attempt used) or deferred (none used).
    RELEASED = "RELEASED"
    #: Failed for good, into failed jobs.
    FAILED = "FAILED"
    #: The worker's lease expired and another worker has the row; this outcome was not written.
    LOST = "LOST"

    @classmethod
    def finished(cls) -> frozenset[JobState]:
        """The states counted as done (history, the worker's last-minute counts, drain)."""
        return _FINISHED

    @property
    def is_done(self) -> bool:
        """Counted as done: ``DONE``, ``SKIPPED``, ``DELETED`` or ``CANCELLED``."""
        return self in _FINISHED

    @property
    def is_failure(self) -> bool:
        """An error: ``FAILED`` or ``LOST`` (a warning in the log, an error span)."""
        return self in _FAILURES

    @property
    def is_timed(self) -> bool:
        """A run whose time the duration metric records: ``DONE`` or ``FAILED``."""
        return self is JobState.DONE or self is JobState.FAILED


_FINISHED = frozenset({JobState.DONE, JobState.SKIPPED, JobState.DELETED, JobState.CANCELLED})
_FAILURES = frozenset({JobState.FAILED, JobState.LOST})


class Kind(enum.Enum):
    DONE = "done"
    DROPPED = "dropped"
    RELEASED = "released"
    DEFERRED = "deferred"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Outcome:
    """What happened to one run, and why (``reason``: ``exception``, ``overlap``, …)."""

    kind: Kind
    reason: str = ""
    #: When a released or deferred job may run again.
    due: Due = NOW
    #: The job's exception (failed, or released to retry after it).
    exception: BaseException | None = None
    #: ``handle()``'s return value (done).
    result: Any = None
    #: Whether going back to the queue used one of the job's tries.
    counts_attempt: bool = True
    #: Whether ``exception`` counts towards ``max_exceptions`` (not when a middleware
    #: handled it, as ``ThrottlesExceptions`` does).
    counts_exception: bool = True
    #: For people: why a job waits (``circuit 'sms' was open``), which limit ended it, or
    #: what dropped it.
    detail: str = ""

    @classmethod
    def done(cls, result: Any = None) -> Outcome:
        if result is None and cls is Outcome:  # most jobs return nothing: one frozen instance
            return _DONE
        return cls(Kind.DONE, result=result)

    @classmethod
    def dropped(cls, reason: str = "dropped", *, detail: str = "") -> Outcome:
        return cls(Kind.DROPPED, reason=reason, detail=detail)

    @classmethod
    def released(cls, due: Due, *, reason: str = "released",
                 exception: BaseException | None = None, counts_exception: bool = True,
                 detail: str = "") -> Outcome:
        return cls(Kind.RELEASED, reason=reason, due=due, exception=exception,
                   counts_exception=counts_exception, detail=detail)

    @classmethod
    def deferred(cls, due: Due, *, reason: str = "deferred", counts_attempt: bool = False,
                 detail: str = "") -> Outcome:
        return cls(Kind.DEFERRED, reason=reason, due=due, counts_attempt=counts_attempt,
                   detail=detail)

    @classmethod
    def failed(cls, exception: BaseException, *, reason: str = "failed",
               detail: str = "") -> Outcome:
        return cls(Kind.FAILED, reason=reason, exception=exception, detail=detail)

    @classmethod
    def cancelled(cls, detail: str = "cancelled by an operator") -> Outcome:
        return cls(Kind.CANCELLED, reason="cancelled", detail=detail)

    @property
    def goes_back(self) -> bool:
        """Released or deferred: the row returns to the queue."""
        return self.kind in (Kind.RELEASED, Kind.DEFERRED)

    @property
    def state(self) -> JobState:
        """The state the job line logs for this outcome (a deferral is ``RELEASED``, a drop
        ``SKIPPED``)."""
        return STATES[self.kind]


#: The job line's state of each outcome kind.
STATES: dict[Kind, JobState] = {
    Kind.DONE: JobState.DONE, Kind.DROPPED: JobState.SKIPPED, Kind.RELEASED: JobState.RELEASED,
    Kind.DEFERRED: JobState.RELEASED, Kind.FAILED: JobState.FAILED,
    Kind.CANCELLED: JobState.CANCELLED}


_DONE = Outcome(Kind.DONE)
