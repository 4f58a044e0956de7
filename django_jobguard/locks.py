"""Inspecting held locks: which are stale, and why (``manage.py jobs_locks``, the admin).

A lock is stale when it has expired but is still stored, or when the job it was taken for can
no longer be the one holding it:

- a unique lock whose job is no longer queued (finished, cleared, or a rolled-back dispatch
  on a store outside the database, e.g. Redis);
- an overlap lock whose job is not running: no longer queued, not reserved, reserved again
  since the lock was taken (a later attempt after a crash), its lease ran out, or the worker
  holding it is dead (its process is gone on this host, or its heartbeat stopped).

Stale locks are shown, never removed automatically: ``jobs_locks --release KEY`` frees one.
"""

from __future__ import annotations

import datetime
import os
import socket
import uuid
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from django_jobguard.conf import jobguard_settings
from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.stores import LockInfo, Store, get_store

# Clocks of a Redis store and the database may differ a little.
_CLOCK_SLACK = datetime.timedelta(seconds=1)


@dataclass(frozen=True)
class LockStatus:
    """One lock with what is known about its holder."""

    lock: LockInfo
    expires_in: float | None  # seconds from the store's now; None = never, <= 0 = expired
    stale: bool
    reason: str = ""

    def as_dict(self) -> dict:
        info = self.lock
        return {"key": info.key, "kind": info.kind, "owner": info.owner, "token": info.token,
                "job_id": info.job_id, "store": info.store,
                "acquired_at": info.acquired_at.isoformat() if info.acquired_at else None,
                "expires_at": info.expires_at.isoformat() if info.expires_at else None,
                "expires_in": self.expires_in, "stale": self.stale, "reason": self.reason}


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _heartbeat_limit() -> datetime.timedelta:
    interval = max(0.5, min(float(jobguard_settings.RETRY_AFTER) / 3, 15.0))
    return datetime.timedelta(seconds=3 * interval + 2)


def lock_statuses(store: Store | None = None, *, prefix: str = "jobguard:",
                  using: str = DEFAULT_DB_ALIAS) -> list[LockStatus]:
    """Every lock under ``prefix`` in ``store`` (default store), expired ones included."""
    store = store or get_store()
    locks = store.locks(prefix, include_expired=True)
    now = store.now()
    ids = {_uuid(info.job_id) for info in locks} - {None}
    jobs = {}
    workers = {}
    if ids:
        live = ExpressionWrapper(Q(available_at__gt=Now()), output_field=BooleanField())
        for row in QueuedJob.objects.using(using).filter(id__in=ids).annotate(
                lease_live=live).values("id", "reserved_at", "reserved_by", "lease_live"):
            jobs[str(row["id"])] = row
        holders = {row["reserved_by"] for row in jobs.values() if row["reserved_by"]}
        if holders:
            for worker in WorkerRow.objects.using(using).filter(id__in=holders):
                workers[worker.id] = worker
    limit = _heartbeat_limit()
    return [_status(info, now, jobs, workers, limit) for info in locks]


def _status(info: LockInfo, now: datetime.datetime, jobs: dict, workers: dict,
            heartbeat_limit: datetime.timedelta) -> LockStatus:
    expires_in = (info.expires_at - now).total_seconds() if info.expires_at else None
    if expires_in is not None and expires_in <= 0:
        return LockStatus(info, expires_in, True, "expired")
    if _uuid(info.job_id) is None or info.kind not in ("unique", "overlap"):
        return LockStatus(info, expires_in, False)
    row = jobs.get(str(_uuid(info.job_id)))
    if row is None:
        return LockStatus(info, expires_in, True, f"job {info.job_id} is no longer queued")
    if info.kind == "unique":
        return LockStatus(info, expires_in, False)
    reason = _why_not_running(info, row, now, workers, heartbeat_limit)
    return LockStatus(info, expires_in, bool(reason), reason)


def _why_not_running(info: LockInfo, row: dict, now: datetime.datetime, workers: dict,
                     heartbeat_limit: datetime.timedelta) -> str:
    if row["reserved_at"] is None:
        return f"job {info.job_id} is not running"
    if info.acquired_at and row["reserved_at"] > info.acquired_at + _CLOCK_SLACK:
        return f"job {info.job_id} was taken again since the lock was acquired"
    if not row["lease_live"]:
        return f"job {info.job_id}'s lease ran out (its worker stopped)"
    worker = workers.get(row["reserved_by"])
    if worker is None:
        return ""  # a worker without a registry row (run in-process): trust its lease
    if worker.hostname == socket.gethostname() and not _pid_alive(worker.pid):
        return f"worker {worker.id} is dead"
    if worker.last_seen_at < now - heartbeat_limit:
        return f"worker {worker.id} stopped its heartbeat"
    return ""
