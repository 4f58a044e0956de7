"""Bulk actions on every job a search matches (not only a page): retry or forget failed jobs,
delete queued ones, in bounded batches.

A batch is ``batch_size`` ids taken in id order after the last one done (a keyset, so 100,000
matches are never loaded at once and a row that is skipped is not met again), acted on in its
own transaction. A long run is therefore not one transaction: rows a worker or another
operator changes meanwhile are judged batch by batch, and an interrupted run keeps what its
finished batches did (running it again goes on with the rest). One audit line is written for
the whole run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import transaction
from django.db.models import QuerySet

from django_jobguard import queue as job_queue
from django_jobguard import unique_jobs
from django_jobguard.envelope import unique_ref
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.operations import audit
from django_jobguard.operations.failed import requeue_failed
from django_jobguard.operations.queued import delete_unreserved

#: Rows acted on per statement and transaction.
BATCH_SIZE = 500


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action did: ``done`` rows, and ``skipped`` ones it left alone (queued jobs
    a worker holds; failed jobs whose id is queued already)."""

    done: int
    skipped: int = 0


def id_batches(rows: QuerySet, *, batch_size: int = BATCH_SIZE) -> Iterator[list[uuid.UUID]]:
    """The ids ``rows`` matches, ``batch_size`` at a time in id order (a keyset: each batch
    is one indexed query after the last id seen, whatever the earlier batches did)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1.")
    ids = rows.order_by("id").values_list("id", flat=True)
    last = None
    while True:
        batch = list((ids if last is None else ids.filter(id__gt=last))[:batch_size])
        if not batch:
            return
        yield batch
        last = batch[-1]


def retry_matching(rows: QuerySet[FailedJob], *, actor: str = "", description: str = "",
                   batch_size: int = BATCH_SIZE) -> BulkResult:
    """Queue every failed job of ``rows`` again with fresh attempts (as
    :func:`~django_jobguard.operations.retry` does), a batch per transaction; a failed job
    whose id is queued already is skipped and stays in failed jobs."""
    using = rows.db
    done = skipped = 0
    for batch in id_batches(rows, batch_size=batch_size):
        with transaction.atomic(using=using):
            moved, queues = requeue_failed(batch, using=using, skip_queued=True)
            job_queue.notify(queues, using=using)
        done += len(moved)
        skipped += len(batch) - len(moved)
    if done:
        audit.record("retry", done, f"Retried {done} failed job(s) matching "
                     f"{description or 'the search'}", actor)
    return BulkResult(done=done, skipped=skipped)


def forget_matching(rows: QuerySet[FailedJob], *, actor: str = "", description: str = "",
                    batch_size: int = BATCH_SIZE) -> BulkResult:
    """Delete every failed job of ``rows``, a batch per statement."""
    using = rows.db
    done = 0
    for batch in id_batches(rows, batch_size=batch_size):
        done += FailedJob.objects.using(using).filter(id__in=batch)._raw_delete(using)
    if done:
        audit.record("forget", done, f"Forgot {done} failed job(s) matching "
                     f"{description or 'the search'}", actor)
    return BulkResult(done=done)


def delete_matching(rows: QuerySet[QueuedJob], *, actor: str = "", description: str = "",
                    batch_size: int = BATCH_SIZE) -> BulkResult:
    """Delete every queued job of ``rows`` that no worker holds, freeing its unique lock (as
    a cancel does); reserved ones are skipped."""
    using = rows.db
    done = skipped = 0
    for batch in id_batches(rows, batch_size=batch_size):
        payloads = delete_unreserved(
            QueuedJob.objects.using(using).filter(id__in=batch), using=using)
        for payload in payloads:
            unique_jobs.release(unique_ref(payload))
        done += len(payloads)
        skipped += len(batch) - len(payloads)
    if done:
        audit.record("cancel", done, f"Cancelled {done} queued job(s) matching "
                     f"{description or 'the search'}", actor)
    return BulkResult(done=done, skipped=skipped)
