"""Function jobs: ``@job`` and the decorators that stack with it.

``@job`` turns a module-level function into a job class (:class:`FunctionJob`) and returns a
:class:`JobFunction` (the function, plus ``dispatch()``). ``@unique``,
``@unique_until_processing`` and ``@without_overlapping`` add a mixin or a middleware to that
class; they stack with ``@job`` in either order::

    @unique(key=lambda profile_id: profile_id, unique_for=60)
    @job(queue="sync", tries=3)
    def sync_profile(profile_id): ...
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from typing import Any, ClassVar

from django_jobguard import aio, durations
from django_jobguard.jobs import Dispatched, Job, dispatch, dispatch_sync
from django_jobguard.middleware.without_overlapping import WithoutOverlapping
from django_jobguard.unique_jobs import ShouldBeUnique, ShouldBeUniqueUntilProcessing

__all__ = ["AsyncFunctionJob", "FunctionJob", "JobFunction", "OverlapFactory", "job", "unique",
           "unique_until_processing", "without_overlapping"]


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


class AsyncFunctionJob(FunctionJob):
    """A job that awaits a module-level ``async def`` with the dispatched arguments."""

    abstract = True

    async def handle(self) -> Any:
        return await type(self).func(*self.args, **self.kwargs)


class JobFunction:
    """What ``@job`` returns: the function, plus ``dispatch()``/``dispatch_sync()``."""

    def __init__(self, func: Callable[..., Any], job_class: type[FunctionJob],
                 options: dict[str, Any] | None = None) -> None:
        self.func = func
        self.job_class = job_class
        self.options = options or {}
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
        ``on_commit``, ``debounce``, ``tags``, ``fair_key``)."""
        return JobFunction(self.func, self.job_class, {**self.options, **options})

    def dispatch(self, *args: Any, **kwargs: Any) -> Dispatched:
        """Queue a call of the function with these arguments."""
        return dispatch(self.job_class(*args, **kwargs), **self.options)

    def dispatch_sync(self, *args: Any, **kwargs: Any) -> Any:
        return dispatch_sync(self.job_class(*args, **kwargs))


def _extend(
    target: Any,
    *,
    bases: tuple[type, ...] = (),
    class_attrs: dict[str, Any] | None = None,
    middleware: Callable[[Job], Any] | None = None,
) -> Any:
    """Add mixin ``bases``, ``class_attrs`` and a ``middleware`` factory (``factory(job)``
    returns the middleware) to a function job, whether the decorator sits below ``@job`` (on
    the plain function, which ``@job`` reads later) or above it (on the :class:`JobFunction`,
    whose class is rebuilt under the same name). Middleware from stacked decorators runs top
    one outermost.
    """
    if isinstance(target, JobFunction):
        old = target.job_class
        attrs: dict[str, Any] = {"name": old.name, "__module__": old.__module__,
                                 "__qualname__": old.__qualname__, "__doc__": old.__doc__,
                                 **(class_attrs or {})}
        if middleware is not None:
            attrs["middleware_factories"] = [middleware, *old.middleware_factories]
        new_class = type(old.__name__, (*bases, old), attrs)
        return JobFunction(target.func, new_class, target.options)
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
               "priority", "delete_when_missing_models", "keep_result", "debounce",
               "tags")


def job(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    base: type[FunctionJob] = FunctionJob,
    retry_until: Callable[..., datetime.datetime | None] | None = None,
    debounce_key: Callable[..., Any] | None = None,
    fair_key: str | Callable[..., Any] | None = None,
    **options: Any,
) -> Any:
    """Make a module-level function a job: ``@job`` or ``@job(queue="emails", tries=3)``.

    The function runs with the dispatched arguments: ``send_email.dispatch(user_id=7)``.
    ``@job(debounce=(5, 60), debounce_key=lambda user_id: user_id)`` debounces it per key
    (docs/long-jobs.md#debounce). ``fair_key`` (a string, or a function of the job's
    arguments) is the key a fair queue takes turns between (docs/scale-out.md).
    """
    if debounce_key is not None and not callable(debounce_key):
        raise TypeError(f"@job(debounce_key=...) takes a function of the job's arguments, not "
                        f"{debounce_key!r}.")
    unknown = set(options) - set(JOB_OPTIONS)
    if unknown:
        raise TypeError(f"@job got unknown options {sorted(unknown)}; allowed: {JOB_OPTIONS}.")

    def decorate(func: Callable[..., Any]) -> JobFunction:
        is_async = aio.check_function(func)  # TypeError for a generator
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
        if debounce_key is not None:
            attrs["debounce_id"] = lambda self: str(debounce_key(*self.args, **self.kwargs))
        if callable(fair_key):
            attrs["fair_key"] = lambda self: fair_key(*self.args, **self.kwargs)
        elif fair_key is not None:
            attrs["fair_key"] = fair_key
        for mixin_attrs in getattr(func, "_jobguard_class_attrs", []):
            attrs.update(mixin_attrs)
        job_base = base
        if is_async and base is FunctionJob:
            job_base = AsyncFunctionJob
        elif is_async != base.is_async:
            raise TypeError(
                f"@job(base={base.__name__}): its handle() is "
                f"{'async def' if base.is_async else 'a plain def'}, but "
                f"{func.__qualname__} is {'async def' if is_async else 'a plain def'}; use a "
                f"base of the same kind (FunctionJob or AsyncFunctionJob).")
        bases = tuple(getattr(func, "_jobguard_bases", ())) + (job_base,)
        job_class = type(func.__name__, bases, attrs)
        return JobFunction(func, job_class)

    return decorate(func) if func is not None else decorate


# -- unique function jobs ---------------------------------------------------------------------


def unique(
    func: Any = None,
    *,
    key: Callable[..., Any] | None = None,
    unique_for: float | datetime.timedelta = 0,
    until_processing: bool = False,
    via: str | None = None,
) -> Any:
    """Make a function job unique; stack it with ``@job`` in either order::

        @unique(key=lambda profile_id: profile_id, unique_for=60)
        @job
        def sync_profile(profile_id): ...

    ``key`` gets the job's arguments and returns its unique id (default: one per job);
    ``via`` names the store alias.
    """
    if key is not None and not callable(key):
        raise TypeError(f"@unique(key=...) takes a function of the job's arguments, not {key!r}.")
    unique_for = durations.seconds(unique_for, name="@unique(unique_for=...)")
    mixin = ShouldBeUniqueUntilProcessing if until_processing else ShouldBeUnique
    attrs: dict[str, Any] = {"unique_for": unique_for}
    if key is not None:
        attrs["unique_id"] = lambda self: key(*self.args, **self.kwargs)
    if via is not None:
        attrs["unique_via"] = lambda self: via

    def decorate(target: Any) -> Any:
        bases = getattr(getattr(target, "job_class", None), "__mro__", ()) or getattr(
            target, "_jobguard_bases", ())
        if any(issubclass(b, ShouldBeUnique) for b in bases if isinstance(b, type)):
            raise TypeError(f"{getattr(target, '__qualname__', target)} is already unique; "
                            f"use one @unique or @unique_until_processing.")
        return _extend(target, bases=(mixin,), class_attrs=attrs)

    return decorate(func) if func is not None else decorate


def unique_until_processing(func: Any = None, **options: Any) -> Any:
    """``@unique(..., until_processing=True)``: the lock is freed when the job starts."""
    return unique(func, until_processing=True, **options)


# -- overlap-free function jobs ---------------------------------------------------------------


class OverlapFactory:
    """Builds a ``WithoutOverlapping`` per run from the function job's arguments."""

    def __init__(self, key: Callable[..., Any] | None, options: dict[str, Any]) -> None:
        self.key = key
        self.options = options
        self.expire_after = WithoutOverlapping("", **options).expire_after  # validates now

    def __call__(self, job: Any) -> WithoutOverlapping:
        key = self.key(*job.args, **job.kwargs) if self.key is not None else ""
        return WithoutOverlapping(key, **self.options)


def without_overlapping(
    func: Any = None,
    *,
    key: Callable[..., Any] | None = None,
    **options: Any,
) -> Any:
    """``WithoutOverlapping`` for a function job; stack it with ``@job`` in either order::

        @without_overlapping(key=lambda invoice_id: invoice_id, shared=True, expire_after=60)
        @job
        def charge_invoice(invoice_id): ...

    ``key`` gets the job's arguments and returns the overlap key (default: one at a time for
    the whole job); the other options are ``WithoutOverlapping``'s.
    """
    if key is not None and not callable(key):
        raise TypeError(f"@without_overlapping(key=...) takes a function of the job's "
                        f"arguments, not {key!r}.")
    factory = OverlapFactory(key, options)

    def decorate(target: Any) -> Any:
        return _extend(target, middleware=factory)

    return decorate(func) if func is not None else decorate
