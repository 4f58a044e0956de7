"""The Job API: the ``Job`` base class, the ``@job`` decorator and dispatching.

A job is a class whose constructor arguments are its state. ``dispatch()`` stores those
arguments as JSON in a :class:`~django_jobguard.models.QueuedJob` row; a worker rebuilds the
job from them and calls ``handle()``.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone

from django_jobguard import queue as job_queue
from django_jobguard import registry, serialization, signals, unique
from django_jobguard.conf import jobguard_settings
from django_jobguard.exceptions import ManuallyFailedError

Delay = int | float | datetime.timedelta | datetime.datetime | None


@dataclass(frozen=True)
class Dispatched:
    """What ``dispatch()`` returns: the queued job's id, or falsy with ``skipped`` set."""

    id: str | None
    job_name: str
    queue: str
    skipped: str | None = None

    def __bool__(self) -> bool:
        return self.skipped is None


class Job:
    """Base class for jobs. Subclass it, give it a constructor, and implement ``handle()``.

    Class attributes configure how the worker treats the job; ``None`` means "use the worker's
    option" (``--tries``, ``--timeout``, ``--backoff``).
    """

    #: Registered name (default ``module.ClassName``); payloads refer to jobs by it.
    name: ClassVar[str]
    #: Queue the job goes to unless ``dispatch(queue=...)`` says otherwise.
    queue: ClassVar[str | None] = None
    #: Runs allowed before the job fails; 0 = unlimited. ``None`` = the worker's ``--tries`` (1).
    tries: ClassVar[int | None] = None
    #: Fail after this many unhandled exceptions even if tries remain.
    max_exceptions: ClassVar[int | None] = None
    #: Seconds before a retry after an exception: an int, or a list per attempt (last repeats).
    backoff: ClassVar[int | float | list[int | float] | None] = None
    #: Seconds the job may run; ``None`` = the worker's ``--timeout``; 0 = no limit.
    timeout: ClassVar[int | float | None] = None
    #: Fail at once (no retry) when the job times out.
    fail_on_timeout: ClassVar[bool] = False
    #: Higher runs first, from -100 to 100.
    priority: ClassVar[int] = 0
    #: Delete the job silently (no failed job) when a model argument no longer exists.
    delete_when_missing_models: ClassVar[bool] = False
    #: Keep a :class:`~django_jobguard.models.JobResult` when the job ends.
    keep_result: ClassVar[bool] = False

    # Set on the instance while a worker runs it.
    job_id: str | None = None
    lock_token: int | None = None
    #: Store time at which ``RateLimited`` let this run start.
    rate_limit_admitted_at: datetime.datetime | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = f"{cls.__module__}.{cls.__qualname__}"
        if not cls.__dict__.get("abstract", False):
            registry.register(cls)

    def __new__(cls, *args: Any, **kwargs: Any) -> Job:
        self = super().__new__(cls)
        self._args = args
        self._kwargs = kwargs
        self._reset_run_state()
        return self

    def __init__(self, **kwargs: Any) -> None:
        """Default constructor: each keyword argument becomes an attribute of the job."""
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        params = [repr(a) for a in self._args] + [f"{k}={v!r}" for k, v in self._kwargs.items()]
        return f"{type(self).__name__}({', '.join(params)})"

    # -- what subclasses implement --------------------------------------------------------

    def handle(self) -> Any:
        """Do the work. Raise to retry (with ``backoff``) or fail on the last attempt."""
        raise NotImplementedError(f"{type(self).__name__} must implement handle().")

    def middleware(self) -> list[Any]:
        """Middleware wrapped around ``handle()``, outermost first."""
        return []

    def retry_until(self) -> datetime.datetime | None:
        """A deadline instead of ``tries``: retry until then. Evaluated once, at dispatch."""
        return None

    def failed(self, exception: BaseException) -> None:
        """Called once when the job fails for good (clean up, notify)."""

    # -- inside handle() ------------------------------------------------------------------

    def attempts(self) -> int:
        """How many times the job has been taken by a worker, this run included."""
        return self._attempts

    def release(self, delay: Delay = 0) -> None:
        """Put the job back on the queue to run again after ``delay``; this run is an attempt."""
        self._released = (delay, True, "released")

    def defer(self, delay: Delay = 0, *, reason: str = "deferred") -> None:
        """Put the job back without using an attempt (unless DEFERRALS_CONSUME_ATTEMPTS)."""
        self._released = (delay, jobguard_settings.DEFERRALS_CONSUME_ATTEMPTS, reason)

    def fail(self, exception: BaseException | str | None = None) -> None:
        """Fail the job for good once ``handle()`` returns; no further attempts."""
        if exception is None or isinstance(exception, str):
            exception = ManuallyFailedError(exception or "The job was failed manually.")
        if not isinstance(exception, BaseException):
            raise TypeError("fail() takes an exception, a message or nothing.")
        self._failed = exception

    # -- dispatching ----------------------------------------------------------------------

    def dispatch(
        self,
        *,
        delay: Delay = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool = False,
        using: str = DEFAULT_DB_ALIAS,
    ) -> Dispatched:
        """Queue this job; see :func:`dispatch`."""
        return dispatch(
            self, delay=delay, queue=queue, priority=priority, on_commit=on_commit, using=using
        )

    def dispatch_sync(self) -> Any:
        """Run this job now, in this process; see :func:`dispatch_sync`."""
        return dispatch_sync(self)

    # -- internals used by dispatch and the worker ------------------------------------------

    def _reset_run_state(self) -> None:
        self._attempts = 1
        self._released: tuple[Delay, bool, str] | None = None
        self._failed: BaseException | None = None
        self._handled = False
        self._handle_finished = False
        self._payload: dict[str, Any] = {}

    def _run(self) -> Any:
        """The middleware chain around ``handle()``."""

        def call_handle(job: Job) -> Any:
            job._handled = True
            unique.release_on_start(job)  # after every middleware let the job through
            try:
                return job.handle()
            finally:
                job._handle_finished = True  # the timeout no longer interrupts (worker.py)

        chain: Callable[[Job], Any] = call_handle
        for middleware in reversed(list(self.middleware())):
            chain = functools.partial(middleware.handle, next=chain)
        return chain(self)

    @property
    def queue_name(self) -> str:
        return self.queue or jobguard_settings.DEFAULT_QUEUE

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Job:
        """Rebuild a job from its payload (fetches model arguments again)."""
        args, kwargs = serialization.decode_arguments(payload)
        job = cls(*args, **kwargs)
        job._payload = payload
        return job


def _available_at(delay: Delay) -> Any:
    if delay is None:
        return None
    if isinstance(delay, datetime.datetime):
        if timezone.is_naive(delay):
            raise ValueError("delay must be an aware datetime (or seconds / a timedelta).")
        return delay
    if isinstance(delay, (int, float)):
        delay = datetime.timedelta(seconds=delay)
    if not isinstance(delay, datetime.timedelta):
        raise TypeError(f"delay must be seconds, a timedelta or a datetime, not {delay!r}.")
    return delay


def build_row(
    job: Job, *, delay: Delay = None, queue: str | None = None, priority: int | None = None
) -> job_queue.NewJob:
    """Validate ``job`` and turn it into the row to insert; nothing touches the database."""
    payload = serialization.encode_arguments(job._args, job._kwargs)
    deadline = job.retry_until()
    if deadline is not None:
        if not isinstance(deadline, datetime.datetime) or timezone.is_naive(deadline):
            raise TypeError(f"{type(job).__name__}.retry_until() must return an aware datetime.")
        payload["retry_until"] = deadline.isoformat()
    size = serialization.payload_size(payload)
    limit = jobguard_settings.MAX_PAYLOAD_BYTES
    if limit and size > limit:
        raise ValueError(
            f"{job.name} payload is {size} bytes, over JOBGUARD['MAX_PAYLOAD_BYTES'] = {limit}. "
            f"Pass ids instead of large data."
        )
    priority = job.priority if priority is None else priority
    if not -100 <= priority <= 100:
        raise ValueError(f"priority must be between -100 and 100, not {priority}.")
    return job_queue.NewJob(
        name=job.name,
        queue=queue or job.queue_name,
        payload=payload,
        priority=priority,
        delay=_available_at(delay),
    )


def dispatch(
    job: Job,
    *,
    delay: Delay = None,
    queue: str | None = None,
    priority: int | None = None,
    on_commit: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> Dispatched:
    """Queue ``job``. Returns a truthy :class:`Dispatched` with the job id, or a falsy one
    with ``skipped="unique"`` when a unique job with the same key is already queued or running.

    The row is inserted in the caller's transaction, so a rollback takes it away again;
    ``on_commit=True`` inserts it after the transaction commits instead.
    """
    return dispatch_many([job], delay=delay, queue=queue, priority=priority,
                         on_commit=on_commit, using=using)[0]


def dispatch_many(
    jobs: Iterable[Job],
    *,
    delay: Delay = None,
    queue: str | None = None,
    priority: int | None = None,
    on_commit: bool = False,
    using: str = DEFAULT_DB_ALIAS,
    batch_size: int = 500,
) -> list[Dispatched]:
    """Queue many jobs with one INSERT per ``batch_size`` rows; unique jobs are checked each."""
    jobs = list(jobs)
    rows = [build_row(job, delay=delay, queue=queue, priority=priority) for job in jobs]
    results: list[Dispatched] = []
    to_insert: list[tuple[Job, job_queue.NewJob]] = []
    skipped: list[Job] = []

    def release_locks() -> None:
        """The insert failed: give back the unique locks taken for it (owner-checked)."""
        for _, row in to_insert:
            if "unique" in row.payload:
                unique.release(row.payload)

    try:
        for job, row in zip(jobs, rows, strict=True):
            lock = unique.acquire_for_dispatch(job, row.id)
            if lock is False:
                results.append(Dispatched(id=None, job_name=job.name, queue=row.queue,
                                          skipped="unique"))
                skipped.append(job)
                continue
            if lock:
                row.payload["unique"] = lock
            results.append(Dispatched(id=str(row.id), job_name=job.name, queue=row.queue))
            to_insert.append((job, row))
    except BaseException:
        release_locks()
        raise
    for job in skipped:
        signals.job_skipped_unique.send(sender=type(job), job=job)

    def insert() -> None:
        try:
            job_queue.push([row for _, row in to_insert], using=using, batch_size=batch_size)
        except BaseException:
            release_locks()
            raise
        for job, row in to_insert:
            signals.job_dispatched.send(sender=type(job), job=job, job_id=str(row.id),
                                        queue=row.queue)

    if on_commit:
        transaction.on_commit(insert, using=using)
    else:
        insert()
    return results


def dispatch_sync(job: Job) -> Any:
    """Run ``job`` (middleware and ``handle()``) in this process now and return its result.

    Nothing is queued and uniqueness is not checked; exceptions propagate to the caller.
    """
    job._reset_run_state()
    return job._run()


# -- function jobs -------------------------------------------------------------------------


class JobFunction:
    """What ``@job`` returns: the function, plus ``dispatch()``/``dispatch_sync()``."""

    def __init__(self, func: Callable[..., Any], job_class: type[Job],
                 options: dict[str, Any] | None = None) -> None:
        self.func = func
        self.job_class = job_class
        self._options = options or {}
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<job {self.job_class.name}>"

    @property
    def name(self) -> str:
        return self.job_class.name

    def using(self, **options: Any) -> JobFunction:
        """A copy whose ``dispatch()`` uses these options (``delay``, ``queue``, ``priority``,
        ``on_commit``)."""
        return JobFunction(self.func, self.job_class, {**self._options, **options})

    def dispatch(self, *args: Any, **kwargs: Any) -> Dispatched:
        """Queue a call of the function with these arguments."""
        return dispatch(self.job_class(*args, **kwargs), **self._options)

    def dispatch_sync(self, *args: Any, **kwargs: Any) -> Any:
        return dispatch_sync(self.job_class(*args, **kwargs))


class FunctionJob(Job):
    """A job that calls a module-level function with the dispatched arguments."""

    abstract = True
    func: ClassVar[Callable[..., Any]]
    middleware_factories: ClassVar[list[Callable[[Job], Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def handle(self) -> Any:
        return type(self).func(*self.args, **self.kwargs)

    def middleware(self) -> list[Any]:
        return [factory(self) for factory in self.middleware_factories]


def extend_function_job(
    target: Any,
    *,
    bases: tuple[type, ...] = (),
    class_attrs: dict[str, Any] | None = None,
    middleware: Callable[[Job], Any] | None = None,
) -> Any:
    """What decorators such as ``@unique`` and ``@without_overlapping`` do to a function job:
    add mixin ``bases``, ``class_attrs`` and a ``middleware`` factory (``factory(job)`` returns
    the middleware), whether the decorator sits below ``@job`` (on the plain function, which
    ``@job`` reads later) or above it (on the :class:`JobFunction`, whose class is rebuilt
    under the same name). Middleware from stacked decorators runs top one outermost.
    """
    if isinstance(target, JobFunction):
        old = target.job_class
        attrs: dict[str, Any] = {"name": old.name, "__module__": old.__module__,
                                 "__qualname__": old.__qualname__, "__doc__": old.__doc__,
                                 **(class_attrs or {})}
        if middleware is not None:
            attrs["middleware_factories"] = [middleware, *old.middleware_factories]
        new_class = type(old.__name__, (*bases, old), attrs)
        return JobFunction(target.func, new_class, target._options)
    if not callable(target) or isinstance(target, type):
        raise TypeError(f"This decorator goes on a module-level function (with @job), not on "
                        f"{target!r}.")
    if bases:
        target._jobguard_bases = [*bases, *getattr(target, "_jobguard_bases", [])]
    if class_attrs:
        target._jobguard_class_attrs = [*getattr(target, "_jobguard_class_attrs", []),
                                        class_attrs]
    if middleware is not None:
        target._jobguard_middleware = [middleware, *getattr(target, "_jobguard_middleware", [])]
    return target


JOB_OPTIONS = ("queue", "tries", "max_exceptions", "backoff", "timeout", "fail_on_timeout",
               "priority", "delete_when_missing_models", "keep_result")


def job(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    base: type[FunctionJob] = FunctionJob,
    retry_until: Callable[..., datetime.datetime | None] | None = None,
    **options: Any,
) -> Any:
    """Make a module-level function a job: ``@job`` or ``@job(queue="emails", tries=3)``.

    The function runs with the dispatched arguments: ``send_email.dispatch(user_id=7)``.
    """
    unknown = set(options) - set(JOB_OPTIONS)
    if unknown:
        raise TypeError(f"@job got unknown options {sorted(unknown)}; allowed: {JOB_OPTIONS}.")

    def decorate(func: Callable[..., Any]) -> JobFunction:
        if "<locals>" in func.__qualname__:
            raise TypeError(f"@job needs a module-level function; {func.__qualname__} is nested "
                            f"and a worker could not find it.")
        attrs: dict[str, Any] = {
            "name": name or f"{func.__module__}.{func.__qualname__}",
            "func": staticmethod(func),
            "__module__": func.__module__,
            "__qualname__": func.__qualname__,
            "__doc__": func.__doc__,
            "middleware_factories": list(getattr(func, "_jobguard_middleware", [])),
            **options,
        }
        if retry_until is not None:
            attrs["retry_until"] = lambda self: retry_until(*self.args, **self.kwargs)
        for mixin_attrs in getattr(func, "_jobguard_class_attrs", []):
            attrs.update(mixin_attrs)
        bases = tuple(getattr(func, "_jobguard_bases", ())) + (base,)
        job_class = type(func.__name__, bases, attrs)
        return JobFunction(func, job_class)

    return decorate(func) if func is not None else decorate
