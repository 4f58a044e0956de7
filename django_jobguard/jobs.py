"""The Job API: the ``Job`` base class and dispatching.

A job is a class whose constructor arguments are its state. ``dispatch()`` encodes those
arguments once into an :class:`~django_jobguard.envelope.Envelope` stored as the payload of a
:class:`~django_jobguard.models.QueuedJob` row; a worker rebuilds the job from it and runs it
(:mod:`django_jobguard.worker.pipeline`). Function jobs (``@job``) are in
:mod:`django_jobguard.decorators`.
"""

from __future__ import annotations

import datetime
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone
from django.utils.functional import cached_property

from django_jobguard import (
    aio,
    carriers,
    durations,
    fair_share,
    registry,
    serialization,
    signals,
    tracing,
    unique_jobs,
)
from django_jobguard import debounce as debouncing
from django_jobguard import queue as job_queue
from django_jobguard import results as job_results
from django_jobguard import tags as job_tags
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.context import JobContext
from django_jobguard.durations import Delay
from django_jobguard.envelope import Envelope, UniqueRef
from django_jobguard.exceptions import JobFailedError, ManuallyFailedError
from django_jobguard.middleware.chain import run_middleware, run_middleware_async
from django_jobguard.models import JobResult
from django_jobguard.outcome import Outcome
from django_jobguard.retry import RetryPolicy

__all__ = ["Delay", "Dispatched", "Job", "dispatch", "dispatch_many", "dispatch_sync"]


@dataclass(frozen=True, slots=True)
class Dispatched:
    """What ``dispatch()`` returns: the queued job's id, or falsy with ``skipped`` set."""

    id: str | None
    job_name: str
    queue: str
    skipped: str | None = None
    #: A debounced dispatch that replaced the arguments of the job already waiting (``id``).
    folded: bool = False
    #: The database alias of the queue the job went to.
    using: str | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return self.skipped is None

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job has finished and return what ``handle()`` returned (as its
        result row keeps it: JSON); :class:`~django_jobguard.exceptions.JobFailedError` if
        it failed for good, ``TimeoutError`` after ``timeout`` seconds (the job goes on).
        Only for jobs with ``keep_result = True``. Woken by NOTIFY on PostgreSQL, polling
        elsewhere (docs/long-jobs.md#awaiting-a-result)."""
        if self.id is None:
            raise ValueError(f"This dispatch of {self.job_name} was skipped ({self.skipped}): "
                             f"there is no job to wait for.")
        if not getattr(registry.get(self.job_name), "keep_result", False):
            raise TypeError(f"{self.job_name} does not keep results: set keep_result = True "
                            f"on it to wait for one.")
        return outcome_of(job_results.wait_finished(self.id, timeout=timeout, using=self.using))

    async def await_result(self, timeout: float | None = None) -> Any:
        """:meth:`wait` for async code: the waiting runs off the event loop, in a thread of
        its own whose database connections are closed when it is done."""
        from asgiref.sync import sync_to_async

        def wait_and_close() -> Any:
            try:
                return self.wait(timeout)
            finally:
                connections.close_all()  # this thread's: nothing else will close them

        return await sync_to_async(wait_and_close, thread_sensitive=False)()


# Each field's slot setter: a frozen dataclass's ``__init__`` sets every field through
# ``object.__setattr__`` (2.5 times what _queued costs), and dispatch_many makes a handle a job.
_SET_ID, _SET_JOB_NAME, _SET_QUEUE, _SET_SKIPPED, _SET_FOLDED, _SET_USING = (
    getattr(Dispatched, name).__set__
    for name in ("id", "job_name", "queue", "skipped", "folded", "using"))


def _queued(job_id: str, job_name: str, queue: str, using: str) -> Dispatched:
    """``Dispatched(id=job_id, job_name=job_name, queue=queue, using=using)``, made faster."""
    handle = object.__new__(Dispatched)
    _SET_ID(handle, job_id)
    _SET_JOB_NAME(handle, job_name)
    _SET_QUEUE(handle, queue)
    _SET_SKIPPED(handle, None)
    _SET_FOLDED(handle, False)
    _SET_USING(handle, using)
    return handle


def outcome_of(finished: Any) -> Any:
    """The return value of a finished job's result row, or its failure raised as
    :class:`~django_jobguard.exceptions.JobFailedError`."""
    if isinstance(finished, JobResult) and finished.status == job_results.SUCCESSFUL:
        return finished.return_value
    if isinstance(finished, JobResult):
        error = (finished.errors or [{}])[-1]
        path, trace = error.get("exception_class_path", ""), error.get("traceback", "")
        last = trace.strip().rsplit("\n", 1)[-1] if trace else "no error was recorded"
        raise JobFailedError(f"Job {finished.id} failed: {last}", exception_class=path,
                             traceback=trace)
    raise JobFailedError(f"Job {finished.id} failed: {finished.exception_class}: "
                         f"{finished.message}", exception_class=finished.exception_class,
                         traceback=finished.traceback)


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
    #: ``(seconds, max_wait)``: dispatches of one ``debounce_id()`` fold into one waiting
    #: job, last arguments winning, run ``seconds`` after the last of them but at most
    #: ``max_wait`` after the first (:mod:`django_jobguard.debounce`). ``None``: not debounced.
    debounce: ClassVar[tuple[Any, Any] | None] = None
    #: Tags every dispatch of the job carries (``dispatch(tags=...)`` adds to them):
    #: strings for filtering in the admin and the API (:mod:`django_jobguard.tags`).
    tags: ClassVar[Sequence[str]] = ()
    #: The key a fair queue takes turns between (a tenant): a string, or a method that
    #: computes it from the job's arguments; ``dispatch(fair_key=...)`` overrides it
    #: (:mod:`django_jobguard.fair_share`). ``None``: the key ``""``.
    fair_key: ClassVar[str | None] = None
    #: Keep a :class:`~django_jobguard.models.JobResult` when the job ends.
    keep_result: ClassVar[bool] = False
    #: Adapter jobs only (django.tasks): the keys leading to the dotted name of what the job
    #: runs in its payload (and result row), shown to operators instead of ``name``.
    display_path: ClassVar[tuple[str, ...]] = ()
    result_display_path: ClassVar[tuple[str, ...]] = ()
    #: Whether ``handle()`` is ``async def`` (set for each subclass; the worker runs such a
    #: job on its event loop, see :mod:`django_jobguard.aio`).
    is_async: ClassVar[bool] = False

    if TYPE_CHECKING:
        #: This run: id, attempt, worker and retry policy (:mod:`django_jobguard.context`).
        context: JobContext
    else:
        @cached_property
        def context(self) -> JobContext:
            """This run: id, attempt, worker and retry policy (:mod:`django_jobguard.context`);
            an empty one outside a worker, made when first asked for (a job made only to be
            dispatched never needs it; the worker sets the run's own)."""
            return JobContext()

    #: The arguments the job was made with (``repr`` and the payload show them).
    _dispatch_args: tuple[tuple[Any, ...], dict[str, Any]]
    #: Fencing token of the ``WithoutOverlapping`` lock this run holds.
    lock_token: int | None = None
    #: Store time at which ``RateLimited`` let this run start.
    rate_limit_admitted_at: datetime.datetime | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = f"{cls.__module__}.{cls.__qualname__}"
        cls.is_async = aio.check_job_class(cls)  # TypeError for what could never run
        cls.tags = job_tags.validate(cls.tags, owner=f"{cls.name}.tags")
        if not cls.__dict__.get("abstract", False):
            registry.register(cls)

    def __new__(cls, *args: Any, **kwargs: Any) -> Job:
        self = super().__new__(cls)
        self._dispatch_args = (args, kwargs)
        return self

    def __init__(self, **kwargs: Any) -> None:
        """Default constructor: each keyword argument becomes an attribute of the job."""
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        args, kwargs = self._dispatch_args
        params = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        return f"{type(self).__name__}({', '.join(params)})"

    # -- what subclasses implement --------------------------------------------------------

    def handle(self) -> Any:
        """Do the work. Raise to retry (with ``backoff``) or fail on the last attempt.
        May be ``async def`` (an async job, run on the worker's event loop)."""
        raise NotImplementedError(f"{type(self).__name__} must implement handle().")

    def middleware(self) -> list[Any]:
        """Middleware wrapped around ``handle()``, outermost first."""
        return []

    def debounce_id(self) -> str:
        """What makes two dispatches of a debounced job fold together (default: one per name)."""
        return ""

    def retry_until(self) -> datetime.datetime | None:
        """A deadline instead of ``tries``: retry until then. Evaluated once, at dispatch."""
        return None

    def failed(self, exception: BaseException) -> None:
        """Called once when the job fails for good (clean up, notify)."""

    # -- inside handle() ------------------------------------------------------------------

    @property
    def job_id(self) -> str | None:
        """The queued row's id (``None`` outside a worker)."""
        return self.context.job_id

    def attempts(self) -> int:
        """How many times the job has been taken by a worker, this run included."""
        return self.context.attempt

    @property
    def cancelled(self) -> bool:
        """Whether an operator asked this running job to stop: check it in long loops and
        return (the run then ends as cancelled, not failed). Read at most once a second."""
        return self.context.cancelled()

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far ``handle()`` is (0 to 1) with ``message``, for the admin and the
        API: stored at most once a second, the latest value within a second."""
        self.context.progress(fraction, message)

    @property
    def stopping(self) -> bool:
        """Whether the worker is stopping gracefully (SIGTERM, ``--max-time``, a reload):
        a long job checks it between steps and returns ``self.interrupt()``. Cheap to read."""
        return self.context.stopping()

    def interrupt(self) -> None:
        """Put the job back on the queue at once without using an attempt, once ``handle()``
        returns: it was interrupted, not failed (docs/long-jobs.md)."""
        self.context.request(Outcome.deferred(
            durations.NOW, reason="interrupted",
            detail="it stopped for its worker's graceful stop"))

    def release(self, delay: Delay = 0) -> None:
        """Put the job back on the queue to run again after ``delay``; this run is an attempt."""
        self.context.request(Outcome.released(durations.due(delay)))

    def defer(self, delay: Delay = 0, *, reason: str = "deferred", detail: str = "") -> None:
        """Put the job back without using an attempt (unless DEFERRALS_CONSUME_ATTEMPTS).
        ``detail`` tells operators why it waits (``"circuit 'sms' was open"``)."""
        self.context.request(Outcome.deferred(
            durations.due(delay), reason=reason, detail=detail,
            counts_attempt=jobguard_settings.DEFERRALS_CONSUME_ATTEMPTS))

    def fail(self, exception: BaseException | str | None = None) -> None:
        """Fail the job for good once ``handle()`` returns; no further attempts."""
        if exception is None or isinstance(exception, str):
            exception = ManuallyFailedError(exception or "The job was failed manually.")
        if not isinstance(exception, BaseException):
            raise TypeError("fail() takes an exception, a message or nothing.")
        self.context.request(Outcome.failed(exception, reason="failed",
                                            detail="failed by the job (fail() was called)"))

    # -- dispatching ----------------------------------------------------------------------

    def dispatch(
        self,
        *,
        delay: Delay = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str = False,
        using: str | None = None,
        debounce: tuple[Any, Any] | None = None,
        tags: Sequence[str] | None = None,
        fair_key: str | None = None,
    ) -> Dispatched:
        """Queue this job; see :func:`dispatch`."""
        using = queue_database(using)
        return dispatch(
            self, delay=delay, queue=queue, priority=priority, on_commit=on_commit, using=using,
            debounce=debounce, tags=tags, fair_key=fair_key,
        )

    def dispatch_sync(self) -> Any:
        """Run this job now, in this process; see :func:`dispatch_sync`."""
        return dispatch_sync(self)

    @property
    def queue_name(self) -> str:
        return self.queue or jobguard_settings.DEFAULT_QUEUE

    def to_envelope(self, *, unique: UniqueRef | None = None) -> Envelope:
        """This job's arguments as JSON-safe data (``TypeError`` naming a bad argument), its
        ``retry_until`` deadline, evaluated now, and the ``unique`` lock it would own."""
        args, kwargs = self._dispatch_args
        deadline = _deadline_of(self)
        return Envelope(args=[serialization.encode(arg, path=f"args[{i}]")
                              for i, arg in enumerate(args)],
                        kwargs={key: serialization.encode(value, path=key)
                                for key, value in kwargs.items()},
                        retry_until=deadline, unique=unique)

    @classmethod
    def from_envelope(cls, envelope: Envelope) -> Job:
        """Rebuild a job from its envelope (fetches model arguments again)."""
        return cls(*serialization.decode(envelope.args), **serialization.decode(envelope.kwargs))


def _deadline_of(job: Job) -> datetime.datetime | None:
    """``job.retry_until()``, checked: ``TypeError`` unless it is ``None`` or aware."""
    deadline = job.retry_until()
    if deadline is not None and (not isinstance(deadline, datetime.datetime)
                                 or timezone.is_naive(deadline)):
        raise TypeError(f"{type(job).__name__}.retry_until() must return an aware datetime.")
    return deadline


#: The version and variant bits of a random UUID (RFC 4122 version 4), and the rest.
_UUID4_BITS = (4 << 76) | (0x8000 << 48)
_UUID4_KEEP = ~((0xF000 << 64) | (0xC000 << 48))


def _new_ids(count: int) -> list[uuid.UUID]:
    """``count`` random UUIDs, each as ``uuid.uuid4()`` makes one, from one read of the
    system's random source instead of one read (a system call) per id."""
    if count <= 1:
        return [uuid.uuid4() for _ in range(count)]
    raw = os.urandom(16 * count)
    number = int.from_bytes
    return [uuid.UUID(int=(number(raw[at:at + 16]) & _UUID4_KEEP) | _UUID4_BITS)
            for at in range(0, 16 * count, 16)]


@dataclass(frozen=True, slots=True)
class _Kind:
    """What the rows of one job class share within a dispatch."""

    #: The tags column: the class's tags and the dispatch's (``""`` for none).
    tags: str
    #: Its payload is its arguments, deadline and context alone (``Job.to_envelope``, not
    #: unique, no tracing): encoded without an :class:`Envelope`.
    plain: bool
    #: It has a ``retry_until()`` of its own (``Job``'s returns ``None``).
    deadline: bool
    #: It has a ``queue_name`` of its own (``Job``'s is ``queue`` or ``DEFAULT_QUEUE``).
    queue_name: bool


class _Rows:
    """Turns the jobs of one dispatch into the rows to insert (:func:`build_row` for one,
    ``dispatch_many`` for thousands); nothing touches the database.

    What every job of the call shares is worked out once (the context captured, the
    settings, whether tracing is on), what every job of a class shares once per class (its
    tags merged with the call's, whether its payload is its arguments alone), a queue name
    is checked once, and the ids come from one read of the random source. Each row is still
    checked as :func:`build_row` documents, in the same order, so the first bad job raises
    the same error as before."""

    def __init__(self, count: int, *, queue: str | None, priority: int | None,
                 tags: Sequence[str] | None, fair_key: str | None, context: dict[str, Any],
                 always_envelopes: bool = False) -> None:
        self.queue, self.priority, self.tags, self.fair_key = queue, priority, tags, fair_key
        self.context = context
        #: Build an :class:`Envelope` for every row (its caller reads it), never the plain way.
        self.always_envelopes = always_envelopes
        #: The envelope of each row built, in order; ``None``: a plain payload, no envelope.
        self.envelopes: list[Envelope | None] = []
        self.limit = jobguard_settings.MAX_PAYLOAD_BYTES
        self.default_queue = jobguard_settings.DEFAULT_QUEUE
        self.traced = tracing.tracer() is not None
        self.ids = iter(_new_ids(count))
        self.checked: set[str] = set()
        self.kinds: dict[type[Job], _Kind] = {}
        #: The payload of a job without arguments or deadline (most no-op and signal jobs).
        self.bare = Envelope.encode_plain([], {}, None, context)

    def kind(self, job: Job) -> _Kind:
        cls = type(job)
        kind = self.kinds.get(cls)
        if kind is None:
            declared = cls.tags  # the class's (an instance may use the name for its own data)
            tags = (job_tags.encode(job_tags.merged(declared, self.tags, owner=job.name))
                    if self.tags or declared else "")
            kind = self.kinds[cls] = _Kind(
                tags=tags,
                plain=(not self.always_envelopes and not self.traced
                       and cls.to_envelope is Job.to_envelope
                       and not isinstance(job, unique_jobs.ShouldBeUnique)),
                deadline=cls.retry_until is not Job.retry_until,
                queue_name=cls.queue_name is not Job.queue_name)
        return kind

    def build(self, job: Job, when: durations.Due) -> job_queue.NewJob:
        """``job``'s row, due ``when`` (see :func:`build_row`). Its envelope, when one was
        built (a unique job's holds its lock), goes to :attr:`envelopes`."""
        fair_key = fair_share.key_of(job, self.fair_key)
        cls = type(job)
        kind = self.kinds.get(cls) or self.kind(job)
        if self.queue:
            queue = self.queue
        elif kind.queue_name:
            queue = job.queue_name
        else:
            queue = job.queue or self.default_queue
        if type(queue) is not str or queue not in self.checked:
            problem = job_queue.queue_name_problem(queue)
            if problem is not None:
                raise ValueError(problem)
            self.checked.add(queue)  # a queue name: a string
        row = job_queue.NewJob(name=job.name, queue=queue, payload="", at=when.at,
                               delay=when.delay, id=next(self.ids), fair_key=fair_key,
                               tags=kind.tags)
        envelope = None
        if kind.plain:
            args, kwargs = job._dispatch_args
            deadline = _deadline_of(job) if kind.deadline else None
            if args or kwargs or deadline is not None:
                text = Envelope.encode_plain(
                    [serialization.encode(arg, path=f"args[{i}]") for i, arg in enumerate(args)],
                    {key: serialization.encode(value, path=key) for key, value in kwargs.items()},
                    deadline, self.context)
            else:
                text = self.bare
        else:
            envelope = job.to_envelope(unique=unique_jobs.ref_for(job, row.id))
            if self.context:
                envelope = envelope.replace(context=self.context)
            envelope = tracing.dispatched(job.name, row, envelope)  # its trace context
            text = envelope.encode()
        row.payload = text
        limit = self.limit
        if limit and len(text) > limit / 4:  # a character is at most 4 bytes of UTF-8
            size = len(text) if text.isascii() else len(text.encode())
            if size > limit:
                raise ValueError(
                    f"{job.name} payload is {size} bytes, over JOBGUARD['MAX_PAYLOAD_BYTES'] = "
                    f"{limit}. Pass ids instead of large data.")
        row.priority = job.priority if self.priority is None else self.priority
        if not -100 <= row.priority <= 100:
            raise ValueError(f"priority must be between -100 and 100, not {row.priority}.")
        self.envelopes.append(envelope)
        return row


#: ``build_row``'s default ``context``: capture it for this job.
_CAPTURE = object()


def build_row(job: Job, *, when: durations.Due = durations.NOW, queue: str | None = None,
              priority: int | None = None, tags: Sequence[str] | None = None,
              fair_key: str | None = None,
              context: dict[str, Any] | None | object = _CAPTURE,
              ) -> tuple[job_queue.NewJob, Envelope]:
    """Validate ``job`` and turn it into the row to insert, due ``when``, with the unique lock
    it would own and the class's tags plus ``tags``; nothing touches the database. The
    envelope is encoded once, and that text is both what the row stores and what
    ``MAX_PAYLOAD_BYTES`` measures (its UTF-8 bytes). ``context``: what the context carriers
    captured, when the caller captured it once for many jobs; by default it is captured
    here (the language, correlation id, tenant... of the caller)."""
    if context is _CAPTURE:
        context = carriers.capture()
    rows = _Rows(1, queue=queue, priority=priority, tags=tags, fair_key=fair_key,
                 context=context if isinstance(context, dict) else {}, always_envelopes=True)
    row = rows.build(job, when)
    envelope = rows.envelopes[0]
    assert envelope is not None  # always_envelopes: one for every row
    return row, envelope


def dispatch(
    job: Job,
    *,
    delay: Delay = None,
    queue: str | None = None,
    priority: int | None = None,
    on_commit: bool | str = False,
    using: str | None = None,
    debounce: tuple[Any, Any] | None = None,
    tags: Sequence[str] | None = None,
    fair_key: str | None = None,
) -> Dispatched:
    """Queue ``job``. Returns a truthy :class:`Dispatched` with the job id, or a falsy one
    with ``skipped="unique"`` when a unique job with the same key is already queued or running.
    A debounced job (``debounce=(seconds, max_wait)`` here or on its class) whose key already
    has a waiting job replaces that job's arguments instead: ``folded`` is True and ``id`` is
    the waiting job's (:mod:`django_jobguard.debounce`). ``tags`` (strings) are added to the
    class's ``tags`` on the row, for filtering (:mod:`django_jobguard.tags`).

    The row is inserted in the caller's transaction, so a rollback takes it away again;
    ``on_commit=True`` inserts it after the transaction commits instead. With the queue on a
    database of its own (``JOBGUARD['DATABASE']``) the insert commits on that database at once
    whatever the caller's transaction on ``default`` does; ``on_commit=True`` waits for the
    transaction of ``default`` (or of the alias ``on_commit`` names) to commit.

    ``fair_key`` replaces the job's own (its class attribute or method): the key a fair
    queue takes turns between (:mod:`django_jobguard.fair_share`).
    """
    using = queue_database(using)
    return dispatch_many([job], delay=delay, queue=queue, priority=priority,
                         on_commit=on_commit, using=using, debounce=debounce, tags=tags,
                         fair_key=fair_key)[0]


def dispatch_many(
    jobs: Iterable[Job],
    *,
    delay: Delay = None,
    queue: str | None = None,
    priority: int | None = None,
    on_commit: bool | str = False,
    using: str | None = None,
    batch_size: int = 500,
    debounce: tuple[Any, Any] | None = None,
    tags: Sequence[str] | None = None,
    fair_key: str | None = None,
) -> list[Dispatched]:
    """Queue many jobs with one INSERT per ``batch_size`` rows; unique jobs are checked each.

    The rows go in first and the unique locks are taken after them, in one transaction: a
    job whose lock another copy holds has its row taken out again before anyone sees it.
    With ``on_commit=True`` inside a transaction all of it happens at the commit: until then
    each result has the id its job will have, and a duplicate found at the commit is dropped
    then (its result in the returned list becomes skipped; ``job_skipped_unique`` is sent).
    """
    using = queue_database(using)
    jobs = list(jobs)
    when = durations.due(delay)
    # A job without debounce (most) skips _debounce_of's parse: None is no rule.
    debounced = [None if debounce is None and job.debounce is None
                 else _debounce_of(job, debounce, delay) for job in jobs]
    rows = _Rows(len(jobs), queue=queue, priority=priority, tags=tags, fair_key=fair_key,
                 context=carriers.capture())  # once: the caller's context is the same for all
    build = rows.build
    if any(rule is not None for rule in debounced):
        built = [build(job, when if rule is None else durations.due(rule.seconds))
                 for job, rule in zip(jobs, debounced, strict=True)]
    else:
        built = [build(job, when) for job in jobs]
        debounced = []
    envelopes = rows.envelopes
    results = [_queued(str(row.id), row.name, row.queue, using) for row in built]

    def insert() -> None:
        if debounced:
            kept = _push_debounced(jobs, built, envelopes, debounced, results, using=using,
                                   batch_size=batch_size)
        else:
            kept = _push_unique(jobs, built, envelopes, using=using, batch_size=batch_size)
        everything = len(kept) == len(jobs)
        if not everything:
            for i, (job, row) in enumerate(zip(jobs, built, strict=True)):
                if i not in kept and not results[i].folded:
                    results[i] = Dispatched(id=None, job_name=job.name, queue=row.queue,
                                            skipped="unique", using=using)
                    signals.job_skipped_unique.send(sender=type(job), job=job)
        inserted = []
        listening: dict[type[Job], bool] = {}
        for i in range(len(jobs)) if everything else sorted(kept):
            job, row = jobs[i], built[i]
            job_id = results[i].id or str(row.id)  # str(row.id), made once above
            inserted.append(job_id)
            cls = type(job)
            heard = listening.get(cls)
            if heard is None:  # send() costs even with no receiver: asked once per class
                heard = listening[cls] = signals.job_dispatched.has_listeners(cls)
            if heard:
                signals.job_dispatched.send(sender=cls, job=job, job_id=job_id,
                                            queue=row.queue, priority=row.priority,
                                            delay=row.delay, at=row.at)
        if inserted:
            signals.jobs_inserted.send(sender=Job, job_ids=inserted, using=using)

    if on_commit:  # at once outside a transaction
        transaction.on_commit(insert, using=commit_database(on_commit))
    else:
        insert()
    return results


def _push_debounced(jobs: list[Job], built: list[job_queue.NewJob],
                    envelopes: list[Envelope | None],
                    debounced: list[debouncing.Debounce | None], results: list[Dispatched], *,
                    using: str, batch_size: int) -> set[int]:
    """Insert the jobs without a debounce rule (:func:`_push_unique`), then fold or insert
    each debounced one (``results`` of the folded become their waiting job's, and
    ``job_dispatched`` is sent for them here); the indexes of the jobs inserted."""
    plain = [i for i, rule in enumerate(debounced) if rule is None]
    kept = {plain[k] for k in _push_unique([jobs[i] for i in plain],
                                           [built[i] for i in plain],
                                           [envelopes[i] for i in plain], using=using,
                                           batch_size=batch_size)}
    for i, rule in enumerate(debounced):
        if rule is not None:
            row = built[i]
            job_id, folded = debouncing.fold_or_push(row, debouncing.key_for(jobs[i]), rule,
                                                   using=using)
            if folded:
                results[i] = Dispatched(id=job_id, job_name=jobs[i].name, queue=row.queue,
                                        folded=True, using=using)
                signals.job_dispatched.send(sender=type(jobs[i]), job=jobs[i],
                                            job_id=job_id, queue=row.queue,
                                            priority=row.priority, delay=rule.seconds,
                                            at=None)
            else:
                kept.add(i)
    return kept


def _debounce_of(job: Job, given: Any, delay: Delay) -> debouncing.Debounce | None:
    """The debounce rule of a dispatch of ``job`` (its argument, else the class's), checked."""
    rule = debouncing.parse(given if given is not None else job.debounce,
                          name=f"{job.name} debounce")
    if rule is None:
        return None
    if delay is not None:
        raise ValueError(f"{job.name}: a debounced dispatch takes no delay (its debounce "
                         f"seconds are its delay).")
    if unique_jobs.ref_for(job, "") is not None:
        raise TypeError(f"{job.name} is both unique and debounced; a debounced job is already "
                        f"one waiting job per key: drop ShouldBeUnique.")
    return rule


def commit_database(on_commit: bool | str) -> str:
    """The alias whose transaction ``dispatch(on_commit=...)`` waits for: the one named, or
    ``default`` for ``True``. The caller's own data lives on ``default`` (Django's convention,
    and where the router sends every model but the queue's), so that is the commit the job must
    not run before, wherever the queue is. With the queue on ``default`` too, it is the same
    transaction as before a separate queue database existed."""
    return on_commit if isinstance(on_commit, str) else DEFAULT_DB_ALIAS


def _push_unique(jobs: list[Job], rows: list[job_queue.NewJob],
                 envelopes: list[Envelope | None], *, using: str, batch_size: int) -> set[int]:
    """Insert the rows, then take the unique locks; the indexes of the jobs kept.

    Rows first: a lock is then never held by a job without a row, except when the caller's
    transaction rolls back later, which :func:`unique_jobs.acquire` recognises. A failure
    gives back the locks taken (owner-checked) and the transaction takes the rows away."""
    if not any(envelope is not None and envelope.unique for envelope in envelopes):
        job_queue.push(rows, using=using, batch_size=batch_size)
        return set(range(len(rows)))
    taken: list[UniqueRef] = []
    kept: set[int] = set()
    try:
        with transaction.atomic(using=using):
            job_queue.push(rows, using=using, batch_size=batch_size)
            for i, (job, envelope) in enumerate(zip(jobs, envelopes, strict=True)):
                if envelope is None or envelope.unique is None:
                    kept.add(i)
                elif unique_jobs.acquire(job, envelope.unique, using=using):
                    taken.append(envelope.unique)
                    kept.add(i)
            job_queue.withdraw([row.id for i, row in enumerate(rows) if i not in kept],
                               using=using)
    except BaseException:
        for ref in taken:
            unique_jobs.release(ref)
        raise
    return kept


def dispatch_sync(job: Job) -> Any:
    """Run ``job`` (middleware and ``handle()``) in this process now and return its result.

    Nothing is queued and uniqueness is not checked; exceptions propagate to the caller. An
    async job runs to its end on an event loop of its own (not from inside a running loop).
    """
    job.context = JobContext(policy=RetryPolicy.for_job(job))
    if job.is_async:
        return aio.run_blocking(lambda: run_middleware_async(job), in_worker=False)
    return run_middleware(job)
