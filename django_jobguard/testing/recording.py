"""``capture()``: record the jobs dispatched while it is active, and assert on them.

The jobs are still queued as usual (so :func:`~django_jobguard.testing.drain` can run them);
the capture only listens to :data:`~django_jobguard.signals.job_dispatched`. Inside a
``TestCase`` a ``dispatch(on_commit=True)`` is recorded once the code under test has left its
own transaction: every assertion, and leaving the block, first runs the test case's pending
``on_commit`` callbacks (:mod:`django_jobguard.testing.commits`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django_jobguard import signals
from django_jobguard.testing.commits import run_on_commit_callbacks

if TYPE_CHECKING:
    from django_jobguard.jobs import Job

__all__ = ["Capture", "CaptureMixin", "CapturedJob", "assert_dispatched",
           "assert_not_dispatched", "capture", "dispatched"]

_active: list[Capture] = []


@dataclass(frozen=True)
class CapturedJob:
    """One dispatched job: the instance, its arguments and the options it was queued with."""

    job: Any
    id: str
    name: str
    queue: str
    priority: int = 0
    delay: float | None = None
    at: datetime.datetime | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        params = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        text = f"{self.name}({', '.join(params)}) queue={self.queue!r}"
        if self.priority:
            text += f" priority={self.priority}"
        if self.delay:
            text += f" delay={self.delay:g}s"
        if self.at is not None:
            text += f" at={self.at.isoformat()}"
        return text


def _job_class(job: Any, caller: str) -> type[Job]:
    """The job class of ``job`` (a ``Job`` subclass or an ``@job`` function); TypeError else."""
    from django_jobguard.decorators import JobFunction
    from django_jobguard.jobs import Job

    if isinstance(job, JobFunction):
        return job.job_class
    if isinstance(job, type) and issubclass(job, Job):
        return job
    raise TypeError(f"{caller}() takes a Job subclass or an @job function, not {job!r} "
                    f"({type(job).__name__}).")


class Capture:
    """The jobs dispatched while this capture is active (see :func:`capture`)."""

    def __init__(self) -> None:
        self.jobs: list[CapturedJob] = []
        self.skipped: list[Any] = []  # unique jobs not queued because a copy held the lock

    # -- context manager ------------------------------------------------------------------

    def __enter__(self) -> Capture:
        signals.job_dispatched.connect(self._on_dispatched, dispatch_uid=f"capture-{id(self)}")
        signals.job_skipped_unique.connect(self._on_skipped, dispatch_uid=f"skip-{id(self)}")
        _active.append(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if exc_info[0] is None:
                run_on_commit_callbacks()
        finally:
            signals.job_dispatched.disconnect(dispatch_uid=f"capture-{id(self)}")
            signals.job_skipped_unique.disconnect(dispatch_uid=f"skip-{id(self)}")
            _active.remove(self)

    def _on_dispatched(self, sender: Any, job: Any, job_id: str, queue: str,
                       **kwargs: Any) -> None:
        args, job_kwargs = getattr(job, "_dispatch_args", ((), {}))
        self.jobs.append(CapturedJob(
            job=job, id=job_id, name=job.name, queue=queue, priority=kwargs.get("priority", 0),
            delay=kwargs.get("delay"), at=kwargs.get("at"), args=tuple(args),
            kwargs=dict(job_kwargs)))

    def _on_skipped(self, sender: Any, job: Any, **kwargs: Any) -> None:
        self.skipped.append(job)

    # -- looking ---------------------------------------------------------------------------

    def dispatched(self, job: Any = None, *, args: tuple | list | None = None,
                   kwargs: dict[str, Any] | None = None, queue: str | None = None,
                   where: Callable[[CapturedJob], bool] | None = None) -> list[CapturedJob]:
        """The captured jobs of ``job`` (a class or ``@job`` function; all when ``None``)
        matching the given arguments, queue and predicate, in dispatch order."""
        name = _job_class(job, "dispatched").name if job is not None else None
        run_on_commit_callbacks()
        return [found for found in self.jobs
                if (name is None or found.name == name)
                and (args is None or found.args == tuple(args))
                and (kwargs is None or found.kwargs == kwargs)
                and (queue is None or found.queue == queue)
                and (where is None or where(found))]

    def assert_dispatched(self, job: Any, *, args: tuple | list | None = None,
                          kwargs: dict[str, Any] | None = None, queue: str | None = None,
                          count: int | None = None,
                          where: Callable[[CapturedJob], bool] | None = None) -> list[CapturedJob]:
        """Fail unless ``job`` was dispatched (exactly ``count`` times when given) with these
        arguments; the message lists what was dispatched. Returns the matching jobs."""
        job_class = _job_class(job, "assert_dispatched")
        if count is not None and count < 0:
            raise ValueError(f"count must not be negative, not {count}.")
        found = self.dispatched(job_class, args=args, kwargs=kwargs, queue=queue, where=where)
        if (count is None and not found) or (count is not None and len(found) != count):
            wanted = "at least once" if count is None else f"{count} time(s)"
            raise AssertionError(
                f"Expected {self._describe(job_class, args, kwargs, queue)} to be dispatched "
                f"{wanted}, but it was dispatched {len(found)} time(s).\n{self._summary()}")
        return found

    def assert_not_dispatched(self, job: Any, *, args: tuple | list | None = None,
                              kwargs: dict[str, Any] | None = None, queue: str | None = None,
                              where: Callable[[CapturedJob], bool] | None = None) -> None:
        """Fail if ``job`` was dispatched with these arguments; lists what was dispatched."""
        job_class = _job_class(job, "assert_not_dispatched")
        found = self.dispatched(job_class, args=args, kwargs=kwargs, queue=queue, where=where)
        if found:
            raise AssertionError(
                f"Expected {self._describe(job_class, args, kwargs, queue)} not to be "
                f"dispatched, but it was dispatched {len(found)} time(s).\n{self._summary()}")

    def __iter__(self) -> Iterator[CapturedJob]:
        return iter(self.dispatched())

    def __len__(self) -> int:
        return len(self.dispatched())

    @staticmethod
    def _describe(job_class: type[Job], args: Any, kwargs: Any, queue: str | None) -> str:
        parts = []
        if args is not None:
            parts.append(f"args={tuple(args)!r}")
        if kwargs is not None:
            parts.append(f"kwargs={kwargs!r}")
        if queue is not None:
            parts.append(f"queue={queue!r}")
        return job_class.name + (f" with {', '.join(parts)}" if parts else "")

    def _summary(self) -> str:
        if not self.jobs:
            return "Nothing was dispatched."
        lines = [f"  - {found}" for found in self.jobs]
        return f"Dispatched ({len(self.jobs)}):\n" + "\n".join(lines)


def capture() -> Capture:
    """A context manager recording every job dispatched inside it::

        with capture() as jobs:
            place_order(42)
        jobs.assert_dispatched(SyncStock, args=(42,), queue="stock", count=1)
    """
    return Capture()


def _current(caller: str) -> Capture:
    if not _active:
        raise RuntimeError(f"{caller}() needs an active capture: use `with capture():`, the "
                           "jobguard_capture fixture or CaptureMixin.")
    return _active[-1]


def assert_dispatched(job: Any, **options: Any) -> list[CapturedJob]:
    """:meth:`Capture.assert_dispatched` on the innermost active capture."""
    _job_class(job, "assert_dispatched")
    return _current("assert_dispatched").assert_dispatched(job, **options)


def assert_not_dispatched(job: Any, **options: Any) -> None:
    """:meth:`Capture.assert_not_dispatched` on the innermost active capture."""
    _job_class(job, "assert_not_dispatched")
    _current("assert_not_dispatched").assert_not_dispatched(job, **options)


def dispatched(job: Any = None, **options: Any) -> list[CapturedJob]:
    """:meth:`Capture.dispatched` on the innermost active capture."""
    return _current("dispatched").dispatched(job, **options)


class CaptureMixin:
    """A ``TestCase`` mixin: every test runs inside a :func:`capture` (``self.jobs``), with
    ``assertDispatched`` / ``assertNotDispatched`` / ``dispatched``."""

    jobs: Capture

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.jobs = Capture().__enter__()
        self.addCleanup(self.jobs.__exit__, None, None, None)  # type: ignore[attr-defined]

    def assertDispatched(self, job: Any, **options: Any) -> list[CapturedJob]:  # noqa: N802
        return self.jobs.assert_dispatched(job, **options)

    def assertNotDispatched(self, job: Any, **options: Any) -> None:  # noqa: N802
        self.jobs.assert_not_dispatched(job, **options)

    def dispatched(self, job: Any = None, **options: Any) -> list[CapturedJob]:
        return self.jobs.dispatched(job, **options)
