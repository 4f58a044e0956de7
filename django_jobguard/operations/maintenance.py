"""Housekeeping: what every worker does once a minute, and pruning job results."""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass

from django.db import transaction
from django.db.models import JSONField, TextField, Value
from django.db.models.functions import Cast

from django_jobguard import history, results, unique_jobs
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.dialects.base import load_payload
from django_jobguard.envelope import unique_ref
from django_jobguard.exceptions import PoisonRowError, StoreUnavailableError
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.operations import audit
from django_jobguard.operations.failed import failed_before
from django_jobguard.operations.workers import dead_workers
from django_jobguard.stores import get_store
from django_jobguard.workflows import batches

logger = logging.getLogger("django_jobguard.worker")


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
    runs: int = 0  # finished runs older than HISTORY_RETENTION_DAYS (one bounded batch)
    quarantined: int = 0  # rows that could never become due, moved to failed jobs


#: Later than any date Python (so Django) can load: a row due after it never is.
NEVER = datetime.datetime.max.replace(tzinfo=datetime.UTC)
#: Seconds between two :func:`quarantine_unreachable` runs of a process's housekeeping: the
#: search reads the whole queue table (no index leads with ``available_at``).
QUARANTINE_EVERY = 3600.0
_quarantined_at: list[float] = []  # when this process last ran it (monotonic clock)


def quarantine_unreachable(*, using: str | None = None, limit: int = 100) -> int:
    """Fail (quarantine) up to ``limit`` queued rows that can never become due: an
    ``available_at`` past the dates Python has (PostgreSQL ``infinity`` or year 10000,
    SQLite text that is not a date). No claim takes them, so without this they would wait for
    ever. Each becomes a failed job whose reason names the value; its unique lock is
    released. Returns how many."""
    using = queue_database(using)
    waiting = QueuedJob.objects.using(using).filter(available_at__gt=NEVER,
                                                    reserved_at__isnull=True)
    found = list(waiting.annotate(
        payload_text=Cast("payload", TextField()), due=Cast("available_at", TextField()),
    ).values_list("id", "queue", "name", "payload_text", "attempts", "priority", "due")[:limit])
    moved = 0
    for job_id, queue_name, name, text, attempts, priority, due in found:
        payload = load_payload(text)
        problem = f"available_at {due!r} can never be reached (past the dates Python has)"
        with transaction.atomic(using=using):
            if not waiting.filter(id=job_id)._raw_delete(using):
                continue  # changed meanwhile (made due by an operator, or cleared)
            FailedJob.objects.using(using).create(
                id=job_id, queue=queue_name, name=name, attempts=attempts, priority=priority,
                payload=Value(None, JSONField()) if payload is None else payload,
                exception_class=f"{PoisonRowError.__module__}.{PoisonRowError.__qualname__}",
                message=f"Quarantined {name} [{job_id}]: {problem}.",
                reason=f"quarantined: {problem}"[:500])
        moved += 1
        logger.error("Quarantined %s [%s]: %s.", name, job_id, problem)
        unique_jobs.release(unique_ref(payload))
    return moved


def housekeeping(*, using: str | None = None) -> Housekeeping:
    """Drop the expired locks and throttles of the default store, results kept past
    ``RESULT_RETENTION_DAYS``, failed jobs kept past ``FAILED_RETENTION_DAYS`` (when set) and
    the rows of workers silent for ``DEAD_WORKER_AFTER_LEASES`` leases, the dashboard's
    per-minute counts older than ``history.KEEP`` (and the run statistics' minute rows; their
    hour rows past ``HISTORY_RETENTION_DAYS``), up to ``history.PRUNE_BATCH`` finished runs
    older than ``HISTORY_RETENTION_DAYS``; queue the
    callbacks of batches a dying worker left complete but not settled; and, once an hour,
    quarantine rows that can never become due (:func:`quarantine_unreachable`). Any live worker runs
    this every minute; routine, so not in the audit log (one bulk DELETE each)."""
    using = queue_database(using)
    store = get_store()
    locks = throttles = 0
    if not store.cleans_itself:  # (Redis: no call from the thread that renews the leases)
        try:
            locks = store.clean_expired()
            throttles = store.clean_expired_throttles()
        except StoreUnavailableError as outage:  # the queue's own chores do not wait for it
            logger.warning("Housekeeping skipped the expired locks and throttles of store %s: "
                           "it is unavailable (%s).", outage.store, outage.error_line)
    retention = result_retention()
    pruned = results.prune(older_than=retention, using=using) if retention else 0
    dead = dead_workers(using=using).delete()[0]
    keep_failed = failed_retention()
    failed = failed_before(keep_failed, using)._raw_delete(using) if keep_failed else 0
    settled = batches.settle_finished(using=using)
    minutes = history.prune(using=using) + history.prune_statistics(using=using)
    runs = history.prune_runs(using=using)
    quarantined = 0
    if not _quarantined_at or time.monotonic() - _quarantined_at[-1] >= QUARANTINE_EVERY:
        _quarantined_at[:] = [time.monotonic()]
        quarantined = quarantine_unreachable(using=using)
    return Housekeeping(expired_locks=locks, expired_throttles=throttles, results=pruned,
                        dead_workers=dead, failed=failed, batches=settled, history=minutes,
                        runs=runs, quarantined=quarantined)
