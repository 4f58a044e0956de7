"""Unique jobs: a second dispatch of the same job is dropped while one is queued or running.

The lock ``jobguard:unique:<job name>:<unique id>`` is taken at dispatch with the job's id as
owner, and stored in the payload (key, store, owner) so that the worker releases exactly that
lock, even when the job can no longer be rebuilt. A release never frees a lock a newer
dispatch owns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django_jobguard.stores import get_store

if TYPE_CHECKING:
    from django_jobguard.jobs import Job


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
    return f"jobguard:unique:{job.name}:{job.unique_id()}"


def acquire_for_dispatch(job: Job, job_id: Any) -> dict[str, str] | None | bool:
    """Take the unique lock for ``job``: the payload entry, ``None`` if the job is not unique,
    or ``False`` if another copy holds the lock."""
    if not isinstance(job, ShouldBeUnique):
        return None
    store = get_store(job.unique_via())
    key, owner = lock_key(job), str(job_id)
    if store.acquire(key, owner, ttl=job.unique_for or None, job_id=owner) is None:
        return False
    return {"key": key, "store": store.alias, "owner": owner}


def release(payload: dict[str, Any]) -> bool:
    """Release the unique lock recorded in ``payload`` if this job still owns it."""
    info = payload.get("unique") if isinstance(payload, dict) else None
    if not isinstance(info, dict) or not {"key", "store", "owner"} <= info.keys():
        return False
    return get_store(info["store"]).release(info["key"], info["owner"])


def release_on_start(job: Job) -> None:
    """``ShouldBeUniqueUntilProcessing``: free the lock as the job starts running."""
    if isinstance(job, ShouldBeUniqueUntilProcessing):
        release(job._payload)
