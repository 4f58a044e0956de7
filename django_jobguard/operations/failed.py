"""Failed jobs: retry, forget, flush, prune."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import QuerySet, Value
from django.db.models.functions import Now

from django_jobguard import queue as job_queue
from django_jobguard import registry, results, workflows
from django_jobguard.conf import queue_database
from django_jobguard.envelope import Envelope
from django_jobguard.exceptions import JobGuardError
from django_jobguard.models import FailedJob, JobResult, QueuedJob
from django_jobguard.operations import audit

#: Failed jobs named by an iterable of rows or ids; a queryset selects; ``None`` means all.
FailedSelection = QuerySet | Iterable[FailedJob | str | uuid.UUID] | None


class FailedJobNotFound(LookupError):
    """Some of the failed jobs named by id do not exist (``ids`` lists them)."""

    def __init__(self, ids: Iterable[str]) -> None:
        self.ids = list(ids)
        super().__init__(f"No failed job matches {', '.join(self.ids)}.")


def parse_ids(ids: Iterable[Any]) -> list[uuid.UUID]:
    """Job ids as UUIDs (``FailedJob`` rows give theirs), without repeats; ``ValueError``
    naming a bad one."""
    parsed = []
    for value in ids:
        if isinstance(value, FailedJob):
            value = value.id
        try:
            parsed.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError:
            raise ValueError(f"Failed job ids are UUIDs; {value!r} is not one.") from None
    return list(dict.fromkeys(parsed))


def _failed_ids(failed: FailedSelection, *, queue_name: str | None,
                using: str) -> list[uuid.UUID]:
    """The ids ``failed`` selects, in its order (all: oldest failure first)."""
    if failed is None or isinstance(failed, QuerySet):
        rows = FailedJob.objects.using(using).order_by("failed_at", "id") if failed is None \
            else failed
        if queue_name is not None:
            rows = rows.filter(queue=queue_name)
        return list(rows.values_list("id", flat=True))
    ids = parse_ids(failed)
    found = dict(FailedJob.objects.using(using).filter(id__in=ids).values_list("id", "queue"))
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise FailedJobNotFound(missing)
    return [i for i in ids if queue_name is None or found[i] == queue_name]


def retry(failed: FailedSelection = None, *, queue: str | None = None, actor: str = "",
          using: str | None = None, batch_size: int = 500) -> list[str]:
    """Queue failed jobs again under their ids with fresh attempts, and remove them from
    failed jobs; returns the ids retried.

    ``failed``: ids or rows (each must exist: :class:`FailedJobNotFound`), a queryset, or
    ``None`` for all; ``queue`` narrows any of them. A ``retry_until`` deadline is evaluated
    again, a kept result is READY again, and PostgreSQL workers are woken. All in one
    transaction, one INSERT, UPDATE and DELETE per batch; ``IntegrityError`` when a queued
    job has one of the ids already (nothing is retried then).
    """
    using = queue_database(using)
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1.")
    wanted = _failed_ids(failed, queue_name=queue, using=using)
    done: set[uuid.UUID] = set()
    queues: set[str] = set()
    # Locked in id order, so two retries of overlapping sets cannot deadlock.
    ordered = sorted(wanted)
    with transaction.atomic(using=using):
        for start in range(0, len(ordered), batch_size):
            ids, names = requeue_failed(ordered[start:start + batch_size], using=using)
            done.update(ids)
            queues.update(names)
        job_queue.notify(queues, using=using)
    retried = [str(i) for i in wanted if i in done]
    if retried:
        audit.record("retry", len(retried), f"Retried {len(retried)} failed job(s)"
                     + (f" of queue {queue}" if queue is not None else ""), actor)
    return retried


def requeue_failed(ids: list[uuid.UUID], *, using: str, skip_queued: bool = False
                   ) -> tuple[list[uuid.UUID], set[str]]:
    """Move the failed jobs ``ids`` (one batch, in id order) back to the queue, inside the
    caller's transaction; returns the ids moved and their queues. Rows retried or forgotten
    meanwhile are left out, and with ``skip_queued`` so are ids a queued job has already
    (``IntegrityError`` otherwise)."""
    rows = list(FailedJob.objects.using(using).select_for_update().filter(
        id__in=ids).order_by("id"))
    if skip_queued and rows:
        taken = set(QueuedJob.objects.using(using).filter(
            id__in=[row.id for row in rows]).values_list("id", flat=True))
        rows = [row for row in rows if row.id not in taken]
    if not rows:
        return [], set()
    moved = [row.id for row in rows]
    QueuedJob.objects.using(using).bulk_create([_requeued(row) for row in rows])
    workflows.retried([row.payload for row in rows], [str(row.id) for row in rows],
                      using=using)  # chains resume, batches count them again
    # A kept result (django.tasks) is waiting again.
    JobResult.objects.using(using).filter(id__in=moved).update(status=results.READY,
                                                               finished_at=None)
    FailedJob.objects.using(using).filter(id__in=moved).delete()
    return moved, {row.queue for row in rows}


def _requeued(failed: FailedJob) -> QueuedJob:
    return QueuedJob(id=failed.id, name=failed.name, queue=failed.queue,
                     payload=_fresh_payload(failed), priority=failed.priority,
                     tags=failed.tags, fair_key=failed.fair_key)


def _fresh_payload(failed: FailedJob) -> dict:
    """The payload with its ``retry_until`` evaluated again by the job class (dropped when
    the job cannot be rebuilt: a deadline that passed long ago would fail it at once)."""
    payload = dict(failed.payload)
    if "retry_until" in payload:
        try:
            job = registry.get(failed.name).from_envelope(Envelope.decode(payload))
            deadline = job.retry_until()
            payload["retry_until"] = deadline.isoformat() if deadline else None
        except (LookupError, ValueError, TypeError, JobGuardError):
            payload.pop("retry_until", None)
    return payload


def forget(failed: QuerySet[FailedJob] | Iterable[FailedJob | str | uuid.UUID], *,
           actor: str = "", using: str | None = None) -> int:
    """Delete failed jobs: a queryset, or ids/rows that must exist (:class:`FailedJobNotFound`).
    Returns how many. (:func:`flush` deletes them all.)"""
    using = queue_database(using)
    if failed is None:
        raise ValueError("forget() needs the failed jobs to delete; flush() deletes all.")
    ids = _failed_ids(failed, queue_name=None, using=using)
    deleted = FailedJob.objects.using(using).filter(id__in=ids).delete()[0] if ids else 0
    if deleted:
        audit.record("forget", deleted, f"Forgot {deleted} failed job(s)", actor)
    return deleted


def failed_before(older_than: datetime.timedelta | None, using: str) -> QuerySet[FailedJob]:
    """Failed jobs that failed more than ``older_than`` ago by the database clock (all: None)."""
    rows = FailedJob.objects.using(using).all()
    if older_than is None:
        return rows
    if older_than < datetime.timedelta(0):
        raise ValueError("The age of failed jobs to delete must not be negative.")
    return rows.filter(failed_at__lt=Now() - Value(older_than))


def flush(older_than: datetime.timedelta | None = None, *, actor: str = "",
          using: str | None = None) -> int:
    """Delete every failed job, or those that failed more than ``older_than`` ago (database
    clock). Returns how many."""
    using = queue_database(using)
    deleted = failed_before(older_than, using).delete()[0]
    if deleted:
        age = f" older than {older_than}" if older_than is not None else ""
        audit.record("flush", deleted, f"Flushed {deleted} failed job(s){age}", actor)
    return deleted


def prune_failed(older_than: datetime.timedelta, *, actor: str = "",
                 using: str | None = None) -> int:
    """Delete failed jobs that failed more than ``older_than`` ago. Returns how many."""
    using = queue_database(using)
    deleted = failed_before(older_than, using).delete()[0]
    if deleted:
        audit.record("prune_failed", deleted, f"Pruned {deleted} failed job(s) older than "
                     f"{older_than}", actor)
    return deleted
