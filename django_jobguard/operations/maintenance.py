"""Housekeeping: what every worker does once a minute, and pruning job results."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django_jobguard import batches, history, results
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.operations import audit
from django_jobguard.operations.failed import failed_before
from django_jobguard.operations.workers import dead_workers
from django_jobguard.stores import get_store


def result_retention() -> datetime.timedelta | None:
    """How long finished results are kept (``RESULT_RETENTION_DAYS``; ``None``: forever)."""
    days = float(jobguard_settings.RESULT_RETENTION_DAYS or 0)
    return datetime.timedelta(days=days) if days else None


def prune_results(older_than: datetime.timedelta, *, actor: str = "",
                  using: str | None = None) -> int:
    """Delete results that finished more than ``older_than`` ago, and results whose job is
    gone (cleared). Returns how many."""
    using = queue_database(using)
    if older_than < datetime.timedelta(0):
        raise ValueError("The age of results to delete must not be negative.")
    deleted = results.prune(older_than=older_than, using=using)
    if deleted:
        audit.record("prune_results", deleted, f"Pruned {deleted} job result(s) older than "
                     f"{older_than}", actor)
    return deleted


def failed_retention() -> datetime.timedelta | None:
    """How long failed jobs are kept (``FAILED_RETENTION_DAYS``; ``None``: until removed)."""
    days = jobguard_settings.FAILED_RETENTION_DAYS
    return datetime.timedelta(days=float(days)) if days else None


@dataclass(frozen=True)
class Housekeeping:
    """What one :func:`housekeeping` run removed."""

    expired_locks: int
    expired_throttles: int
    results: int
    dead_workers: int
    failed: int = 0
    batches: int = 0  # batches whose callbacks were queued late (a worker died)
    history: int = 0  # per-minute queue counts older than history.KEEP


def housekeeping(*, using: str | None = None) -> Housekeeping:
    """Drop the expired locks and throttles of the default store, results kept past
    ``RESULT_RETENTION_DAYS``, failed jobs kept past ``FAILED_RETENTION_DAYS`` (when set) and
    the rows of workers silent for ``DEAD_WORKER_AFTER_LEASES`` leases, the dashboard's
    per-minute counts older than ``history.KEEP``; and queue the
    callbacks of batches a dying worker left complete but not settled. Any live worker runs
    this every minute; routine, so not in the audit log (one bulk DELETE each)."""
    using = queue_database(using)
    store = get_store()
    locks = store.clean_expired()
    throttles = store.clean_expired_throttles()
    retention = result_retention()
    pruned = results.prune(older_than=retention, using=using) if retention else 0
    dead = dead_workers(using=using).delete()[0]
    keep_failed = failed_retention()
    failed = failed_before(keep_failed, using)._raw_delete(using) if keep_failed else 0
    settled = batches.settle_finished(using=using)
    minutes = history.prune(using=using)
    return Housekeeping(expired_locks=locks, expired_throttles=throttles, results=pruned,
                        dead_workers=dead, failed=failed, batches=settled, history=minutes)
