"""Unique jobs: a second dispatch of the same job is dropped while one is queued or running.

The lock ``jobguard:unique:<job name>:<unique id>`` is taken at dispatch with the job's id as
owner, and stored in the envelope (key, store, owner) so that the worker releases exactly that
lock, even when the job can no longer be rebuilt. A release never frees a lock a newer
dispatch owns: every release is owner-checked.

The row is inserted first and the lock taken after it, in one transaction, so a lock is
only as good as its owner's row: a second dispatch that finds the lock held by a job with
no row (rolled back, in a store that cannot roll back) takes it over (:func:`acquire`).

When the lock is released:

- ``ShouldBeUnique``: when the job succeeds, is dropped by middleware, or fails for good
  (tries used up, ``fail()``, timeout with ``fail_on_timeout``, missing model). NOT when it is
  released back to the queue for a retry or deferred by middleware.
- ``ShouldBeUniqueUntilProcessing``: just before ``handle()`` runs, after all middleware let
  the job through; a deferral by middleware (``WithoutOverlapping``) keeps it.
- A worker killed mid-job: at ``unique_for`` seconds, or when crash recovery ends the job.

The ``@unique`` / ``@unique_until_processing`` decorators for function jobs are in
:mod:`django_jobguard.decorators`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import DatabaseError, InterfaceError

from django_jobguard import durations, keys
from django_jobguard import queue as job_queue
from django_jobguard.conf import queue_database
from django_jobguard.envelope import UniqueRef
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.stores import get_store

if TYPE_CHECKING:
    from django_jobguard.context import JobLike

logger = logging.getLogger("django_jobguard.unique")


class ShouldBeUnique:
    """Mixin: at most one copy of this job (per ``unique_id()``) queued or running."""

    #: The job's registered name (the class it is mixed into has it).
    name: ClassVar[str]
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


def lock_key(job: ShouldBeUnique) -> str:
    """The lock's key; computed once at dispatch and kept in the envelope."""
    return keys.unique(job.name, job.unique_id())


def ref_for(job: JobLike, job_id: Any) -> UniqueRef | None:
    """The lock a dispatch of ``job`` as ``job_id`` would own (``None``: not a unique job)."""
    if not isinstance(job, ShouldBeUnique):
        return None
    durations.seconds(job.unique_for, name=f"{job.name}.unique_for")  # fail before any lock
    return UniqueRef(key=lock_key(job), store=get_store(job.unique_via()).alias,
                     owner=str(job_id))


def acquire(job: JobLike, ref: UniqueRef, *, using: str | None = None) -> bool:
    """Take ``ref``'s lock for the dispatch; ``False`` when another copy holds it.

    Call it after the job's row is inserted, in the same transaction (``dispatch()`` does).
    A held lock counts only while its owner's row exists: a lock whose job has no row (its
    dispatch rolled back in a store that cannot roll back, or its process died) is taken
    over. An owner's row that an open transaction is inserting is waited for.
    """
    using = queue_database(using)
    unique_for = job.unique_for if isinstance(job, ShouldBeUnique) else 0
    ttl = durations.seconds(unique_for, name=f"{job.name}.unique_for") or None
    store = get_store(ref.store)
    for _ in range(_TAKEOVER_ROUNDS):
        if store.acquire(ref.key, ref.owner, ttl=ttl, job_id=ref.owner) is not None:
            return True
        holder = store.get_lock(ref.key)
        if holder is None:  # freed or expired meanwhile: try again
            continue
        if job_queue.exists(holder.job_id or holder.owner, using=using):
            return False
        logger.warning("Unique lock %s was left by job %s, which is not queued (a rolled-back "
                       "dispatch or a process that died); job %s takes it over.",
                       ref.key, holder.owner, ref.owner)
        store.release(ref.key, holder.owner)  # owner-checked: a newer holder keeps it
    return False


#: Tries at a lock that keeps changing hands before a dispatch counts it as held.
_TAKEOVER_ROUNDS = 3


def release(ref: UniqueRef | None) -> bool:
    """Release ``ref``'s lock if its owner still holds it.

    A connection that a database or Redis restart cut fails the first statement sent on it:
    the release is tried once more on a fresh one. A store error after that is logged, not
    raised: the job's outcome is already recorded, and the lock ends at ``unique_for`` (or
    ``manage.py jobs_locks --release``, or the next dispatch of its key taking it over).
    """
    if ref is None:
        return False
    store = get_store(ref.store)
    try:
        return store.release(ref.key, ref.owner)
    except (DatabaseError, InterfaceError, StoreUnavailableError) as exc:
        logger.debug("Releasing unique lock %s failed (%s); once more on a new connection.",
                     ref.key, exc)
        job_queue.close_broken_connections()
    except Exception:
        logger.exception("Could not release unique lock %s; it stays until it expires.",
                         ref.key)
        return False
    try:
        return store.release(ref.key, ref.owner)  # the lock's owner is checked again
    except Exception:
        logger.exception("Could not release unique lock %s; it stays until it expires.",
                         ref.key)
        return False


def releases_on_start(job: JobLike) -> bool:
    """Whether ``job`` frees its unique lock as ``handle()`` starts."""
    return isinstance(job, ShouldBeUniqueUntilProcessing)


def release_on_start(job: JobLike) -> None:
    """``ShouldBeUniqueUntilProcessing``: free the lock as ``handle()`` starts."""
    if releases_on_start(job):
        release(job.context.envelope.unique)
