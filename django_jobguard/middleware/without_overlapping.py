"""``WithoutOverlapping``: at most one job per key runs at a time.

Return it from ``Job.middleware()``::

    def middleware(self):
        return [WithoutOverlapping(self.invoice_id, shared=True, expire_after=120)]

The lock ``jobguard:overlap:<job name>:<key>`` (``jobguard:overlap:<key>`` with ``shared``) is
taken when the job starts and released when ``handle()`` returns or raises. While another job
holds it, the job is deferred by ``release_after`` seconds (no attempt used unless
``JOBGUARD['DEFERRALS_CONSUME_ATTEMPTS']``), or dropped with ``dont_release`` (deleted, not
failed). The owner is the job id plus a random suffix per run, so a stale run can never release
a newer run's lock. ``expire_after`` bounds how long a killed worker keeps the lock; with
``renew=True`` a thread extends the lock while ``handle()`` runs, so ``expire_after`` can be
short without a long job losing it. ``job.lock_token`` is the lock's fencing token.

``@without_overlapping`` for function jobs is in :mod:`django_jobguard.decorators`.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import secrets
import threading
import uuid
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_jobguard import aio, durations, keys
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.middleware import JobMiddleware, Next
from django_jobguard.stores import Store, get_store

if TYPE_CHECKING:
    from django_jobguard.context import JobLike

logger = logging.getLogger("django_jobguard.overlap")

_warned_unbounded: set[str] = set()


def _seconds(value: Any, name: str) -> float:
    return durations.seconds(value, name=f"WithoutOverlapping({name}=...)")


class WithoutOverlapping(JobMiddleware):
    """Run one job per ``key`` at a time; see the module docstring for the options."""

    def __init__(
        self,
        key: Any = "",
        *,
        release_after: float | datetime.timedelta = 0,
        expire_after: float | datetime.timedelta = 0,
        dont_release: bool = False,
        shared: bool = False,
        renew: bool = False,
        store: str | None = None,
    ) -> None:
        if isinstance(key, enum.Enum):
            key = key.value
        if not isinstance(key, (str, int, uuid.UUID)) or isinstance(key, bool):
            raise TypeError(f"WithoutOverlapping key must be a string, an int or a UUID, not "
                            f"{key!r}.")
        self.key = str(key)
        self.release_after = _seconds(release_after, "release_after")
        self.expire_after = _seconds(expire_after, "expire_after")
        self.dont_release = bool(dont_release)
        self.shared = bool(shared)
        self.renew = bool(renew)
        self.store = store
        if self.renew and not self.expire_after:
            raise ValueError("WithoutOverlapping(renew=True) needs expire_after > 0: renewal "
                             "keeps extending a lock that would otherwise expire.")

    def __repr__(self) -> str:
        return (f"WithoutOverlapping({self.key!r}, release_after={self.release_after:g}, "
                f"expire_after={self.expire_after:g}, dont_release={self.dont_release}, "
                f"shared={self.shared}, renew={self.renew})")

    def lock_key(self, job: JobLike) -> str:
        """``jobguard:overlap:<job name>:<key>``, or ``jobguard:overlap:<key>`` when shared."""
        return keys.overlap(job.name, self.key, shared=self.shared)

    def handle(self, job: JobLike, next: Next) -> Any:
        held = self.enter(job)
        if held is None:
            return None
        try:
            return next(job)
        finally:
            held.leave()

    async def ahandle(self, job: JobLike, next: Next) -> Any:
        """``handle()`` for an async job: the lock is taken and released off the loop, and
        renewed (``renew=True``) by the same thread as for a sync job while the job awaits.
        A job cancelled (its timeout, a cancel, a stop) while the lock is being taken
        releases it once taken (:func:`aio.acquire_sync`), not leaving it held."""
        held = await aio.acquire_sync(self.enter, _Held.leave, job)
        if held is None:
            return None
        try:
            return await next(job)
        finally:
            await asyncio.shield(aio.call_sync(held.leave))

    def enter(self, job: JobLike) -> _Held | None:
        """Take the lock for ``job``; ``None`` after deferring or dropping it (held)."""
        store = get_store(self.store)
        key = self.lock_key(job)
        owner = f"{job.job_id or 'sync'}:{secrets.token_hex(8)}"
        try:
            token = store.acquire(key, owner, ttl=self.expire_after or None,
                                  job_id=job.job_id or "")
        except StoreUnavailableError:
            # The acquire may have taken the lock before its answer was lost (a connection
            # cut on the way back): nobody else knows this owner, so free it if it is held.
            if store.lost_answers_may_apply:
                try:
                    store.release(key, owner)
                except StoreUnavailableError:
                    pass  # still down: the lock's expire_after (or an operator) frees it
            raise
        if token is None:
            if not self.dont_release:
                job.defer(self.release_after, reason="overlap",
                          detail=f"overlap lock {keys.label(key)!r} was held")
            return None  # dropped: deleted as done, not failed
        if not self.expire_after and job.name not in _warned_unbounded:
            _warned_unbounded.add(job.name)
            logger.warning("%s runs WithoutOverlapping(%r) without expire_after: a worker "
                           "killed while running it keeps the lock until someone force-releases "
                           "it (manage.py jobs_locks --release).", job.name, self.key)
        job.lock_token = token
        renewer = _Renewer(store, key, owner, self.expire_after, job.name) if self.renew \
            else None
        return _Held(store, key, owner, renewer)


class _Held:
    """A lock :meth:`WithoutOverlapping.enter` took, released by :meth:`leave`."""

    def __init__(self, store: Store, key: str, owner: str, renewer: _Renewer | None) -> None:
        self.store, self.key, self.owner, self.renewer = store, key, owner, renewer

    def leave(self) -> None:
        if self.renewer is not None:
            self.renewer.stop()
        try:
            self.store.release(self.key, self.owner)
        except Exception:
            logger.exception("Could not release overlap lock %s; it stays until it "
                             "expires.", self.key)


class _Renewer:
    """A daemon thread that extends one lock every third of its ttl until stopped."""

    def __init__(self, store: Store, key: str, owner: str, ttl: float, job_name: str) -> None:
        self.store, self.key, self.owner, self.ttl, self.job_name = (store, key, owner, ttl,
                                                                     job_name)
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"jobguard-renew:{key}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(max(self.ttl / 3, 0.05)):
                try:
                    if not self.store.extend(self.key, self.owner, ttl=self.ttl):
                        self.lost = True
                        logger.warning("%s lost its overlap lock %s before renewing it; another "
                                       "job may hold it now (use job.lock_token to fence "
                                       "writes).", self.job_name, self.key)
                        return
                except Exception as exc:
                    logger.warning("Renewing overlap lock %s failed (%s); retrying.", self.key,
                                   exc)
        finally:
            connections.close_all()  # this thread's own database connections

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
