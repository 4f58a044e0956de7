"""``job.context``: what a running job knows about its run, in one public place.

The worker builds a :class:`JobContext` for every run (the job id, which attempt this is, the
worker, the database alias, the effective :class:`~django_jobguard.retry.RetryPolicy` and the
decoded envelope) and the run records on it what happened (``handle()`` started, returned;
a release, deferral or failure asked for). Middleware and the django.tasks backend read it
instead of private attributes.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Self

from django_jobguard.conf import queue_database
from django_jobguard.durations import Delay
from django_jobguard.envelope import Envelope
from django_jobguard.outcome import Kind, Outcome
from django_jobguard.progress import RunReporter, check_fraction
from django_jobguard.retry import RetryPolicy


@dataclass
class JobContext:
    """One run of one job. A job that was only constructed (or runs by ``dispatch_sync()``)
    has a detached context: no id, attempt 1, no worker."""

    job_id: str | None = None
    #: 1 for the first run; counts runs that began (deferrals give theirs back).
    attempt: int = 1
    worker_id: str | None = None
    #: Database alias holding the queue row.
    using: str = field(default_factory=queue_database)  # JOBGUARD["DATABASE"]
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    envelope: Envelope = field(default_factory=Envelope)
    #: Exceptions that reached the worker in earlier runs (``max_exceptions``).
    exceptions: int = 0
    #: The last of them, as stored on the row (``module.Class: message``).
    last_error: str = ""

    # What happened during this run.
    started_at: datetime.datetime | None = None
    handle_started: bool = False
    handle_finished: bool = False
    handle_returned: bool = False
    #: A release, deferral or failure the job or a middleware asked for.
    requested: Outcome | None = None
    #: Progress writes and cancel reads of this run (``None`` outside a worker).
    reporter: RunReporter | None = None
    #: Whether the job saw ``job.cancelled`` true (the run then ends as cancelled).
    cancel_seen: bool = False
    #: Why jobguard cancelled this run's async task (``aio.TIMEOUT``, ``CANCELLED`` or
    #: ``STOPPED``), ``None`` if it did not: read by middleware even after the job caught it.
    cut_short: str | None = None
    #: Whether the worker running it is stopping gracefully (SIGTERM, ``--max-time``, a
    #: reload): the worker's probe, never true outside a worker.
    stopping: Callable[[], bool] = field(default=lambda: False, repr=False)
    #: The row's claim counter for this run: owner-checked writes of the job's checkpoint.
    claims: int = 0
    #: The checkpoint the row had when this run started (iterable jobs), else ``None``.
    checkpoint: Any = None

    def cancelled(self) -> bool:
        """Whether an operator asked this run to stop (read at most once a second)."""
        if self.reporter is not None and self.reporter.cancelled():
            self.cancel_seen = True
        return self.cancel_seen

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the run is (0 to 1), stored at most once a second."""
        if self.reporter is None:
            check_fraction(fraction)
        else:
            self.reporter.progress(fraction, message)

    def close_reporter(self) -> None:
        """Write the run's last progress and stop reporting (nothing outside a worker)."""
        if self.reporter is not None:
            self.reporter.close()

    def request(self, outcome: Outcome) -> None:
        """Ask for ``outcome`` once the run ends; a failure asked for is never overridden."""
        if self.requested is not None and self.requested.kind is Kind.FAILED:
            return
        self.requested = outcome

    @property
    def really_succeeded(self) -> bool:
        """``handle()`` ran and returned, and nothing released, deferred or failed the job,
        nor did it see an operator's cancel (only this closes a circuit)."""
        return self.handle_returned and self.requested is None and not self.cancel_seen


class JobLike(Protocol):
    """What the layers under :class:`~django_jobguard.jobs.Job` (registry, unique locks, the
    pipeline) use of a job; ``Job`` implements it. They depend on this, not on ``Job``."""

    name: ClassVar[str]
    context: JobContext
    keep_result: ClassVar[bool]
    #: Whether ``handle()`` is ``async def`` (it runs on an event loop).
    is_async: ClassVar[bool]
    delete_when_missing_models: ClassVar[bool]
    #: Seconds a run may take (``None``: the worker's default).
    timeout: ClassVar[int | float | None]
    #: The fencing token of the ``WithoutOverlapping`` lock this run holds, if any.
    lock_token: int | None
    #: When ``RateLimited`` admitted this run (the database clock), if it did.
    rate_limit_admitted_at: datetime.datetime | None

    @property
    def job_id(self) -> str | None: ...

    def handle(self) -> Any: ...

    def middleware(self) -> list[Any]: ...

    def failed(self, exception: BaseException) -> None: ...

    def defer(self, delay: Delay = 0, *, reason: str = "deferred", detail: str = "") -> None: ...

    def retry_until(self) -> datetime.datetime | None: ...

    @classmethod
    def from_envelope(cls, envelope: Envelope) -> Self: ...
