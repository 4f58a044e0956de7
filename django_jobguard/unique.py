"""Unique jobs: a second dispatch of the same job is dropped while one is queued or running.

The lock ``jobguard:unique:<job name>:<unique id>`` is taken at dispatch with the job's id as
owner, and stored in the payload (key, store, owner) so that the worker releases exactly that
lock, even when the job can no longer be rebuilt. A release never frees a lock a newer
dispatch owns: every release is owner-checked.

When the lock is released:

- ``ShouldBeUnique``: when the job succeeds, is dropped by middleware, or fails for good
  (tries used up, ``fail()``, timeout with ``fail_on_timeout``, missing model). NOT when it is
  released back to the queue for a retry or deferred by middleware.
- ``ShouldBeUniqueUntilProcessing``: just before ``handle()`` runs, after all middleware let
  the job through; a deferral by middleware (``WithoutOverlapping``) keeps it.
- A worker killed mid-job: at ``unique_for`` seconds, or when crash recovery ends the job.
"""

from __future__ import annotations

import datetime
import enum
import logging
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from django_jobguard.stores import get_store

if TYPE_CHECKING:
    from django_jobguard.jobs import Job

logger = logging.getLogger("django_jobguard.unique")


class ShouldBeUnique:
    """Mixin: at most one copy of this job (per ``unique_id()``) queued or running."""

    #: Seconds the lock lasts at most (0 = until the job finishes or fails for good).
    unique_for: ClassVar[float] = 0

    def unique_id(self) -> str:
        """What makes two dispatches "the same job" (default: one per job name)."""
        return ""

    def unique_via(self) -> str | None:
        """Store alias holding the lock (default ``JOBGUARD['STORE']``)."""
        return None


class ShouldBeUniqueUntilProcessing(ShouldBeUnique):
    """Mixin: unique while queued; the lock is released when a worker starts the job."""


def lock_key(job: Job) -> str:
    """The lock's key; computed once at dispatch and kept in the payload."""
    value = job.unique_id()
    if isinstance(value, enum.Enum):
        value = value.value
    return f"jobguard:unique:{job.name}:{'' if value is None else value}"


def _unique_for(job: Job) -> float | None:
    value = job.unique_for
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{job.name}.unique_for must be seconds >= 0 (0 = until released), "
                         f"not {value!r}.")
    return float(value) or None


def acquire_for_dispatch(job: Job, job_id: Any) -> dict[str, str] | None | bool:
    """Take the unique lock for ``job``: the payload entry, ``None`` if the job is not unique,
    or ``False`` if another copy holds the lock."""
    if not isinstance(job, ShouldBeUnique):
        return None
    store = get_store(job.unique_via())
    key, owner = lock_key(job), str(job_id)
    if store.acquire(key, owner, ttl=_unique_for(job), job_id=owner) is None:
        return False
    return {"key": key, "store": store.alias, "owner": owner}


def release(payload: dict[str, Any]) -> bool:
    """Release the unique lock recorded in ``payload`` if this job still owns it.

    A store error is logged, not raised: the job's outcome is already recorded, and the lock
    ends at ``unique_for`` (or ``manage.py jobs_locks --release``).
    """
    info = payload.get("unique") if isinstance(payload, dict) else None
    if not isinstance(info, dict) or not {"key", "store", "owner"} <= info.keys():
        return False
    try:
        return get_store(info["store"]).release(info["key"], info["owner"])
    except Exception:
        logger.exception("Could not release unique lock %s; it stays until it expires.",
                         info.get("key"))
        return False


def release_on_start(job: Job) -> None:
    """``ShouldBeUniqueUntilProcessing``: free the lock as ``handle()`` starts."""
    if isinstance(job, ShouldBeUniqueUntilProcessing):
        release(job._payload)


# -- decorators for function jobs ------------------------------------------------------------


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
    from django_jobguard.jobs import extend_function_job

    if key is not None and not callable(key):
        raise TypeError(f"@unique(key=...) takes a function of the job's arguments, not {key!r}.")
    if isinstance(unique_for, datetime.timedelta):
        unique_for = unique_for.total_seconds()
    if isinstance(unique_for, bool) or not isinstance(unique_for, (int, float)) or unique_for < 0:
        raise ValueError(f"@unique(unique_for=...) must be seconds >= 0, not {unique_for!r}.")
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
        return extend_function_job(target, bases=(mixin,), class_attrs=attrs)

    return decorate(func) if func is not None else decorate


def unique_until_processing(func: Any = None, **options: Any) -> Any:
    """``@unique(..., until_processing=True)``: the lock is freed when the job starts."""
    return unique(func, until_processing=True, **options)


class _CallableModule(types.ModuleType):
    """``from django_jobguard import unique`` gives this module (the package's submodule wins
    over a re-exported name), so calling the module is the ``@unique`` decorator."""

    def __call__(self, func: Any = None, **options: Any) -> Any:
        return unique(func, **options)


sys.modules[__name__].__class__ = _CallableModule
