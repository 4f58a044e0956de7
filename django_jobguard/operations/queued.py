"""Queued jobs: cancel (never a reserved job), cancel-or-stop one job, run now, clear, and
requeue a reservation whose worker is gone."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, OuterRef, QuerySet, Value
from django.db.models.functions import Now

from django_jobguard import queue as job_queue
from django_jobguard import unique_jobs, workflows
from django_jobguard.conf import queue_database
from django_jobguard.envelope import unique_ref
from django_jobguard.models import FailedJob, JobResult, QueuedJob, QueuedJobQuerySet, Worker
from django_jobguard.operations import audit
from django_jobguard.operations.workers import (
    ALIVE,
    ENDED,
    UNKNOWN,
    heartbeat_grace,
    worker_states,
)


@dataclass
class CancelResult:
    cancelled: list[str]
    reserved: list[str]


def cancel(jobs: Iterable[QueuedJob], *, actor: str = "",
           using: str | None = None) -> CancelResult:
    """Delete jobs that no worker holds and free their unique locks; reserved ones stay.

    Each delete re-checks the state in SQL, so a job a worker claims meanwhile is not deleted.
    """
    using = queue_database(using)
    result = CancelResult(cancelled=[], reserved=[])
    for row in jobs:
        # _raw_delete: one DELETE whose WHERE re-checks the state (Django's delete() could
        # load the rows first and then delete them by id).
        follow = workflows.involved(row.payload)
        with transaction.atomic(using=using) if follow else nullcontext():
            deleted = QueuedJob.objects.using(using).unreserved().filter(
                id=row.id)._raw_delete(using)
            if deleted and follow:  # a batch counts it as processed, a chain stops
                workflows.finished(row.payload, outcome=workflows.SKIPPED, job_id=str(row.id),
                                   using=using)
        if deleted:
            unique_jobs.release(unique_ref(row.payload))
            result.cancelled.append(str(row.id))
        else:
            result.reserved.append(str(row.id))
    if result.cancelled:
        audit.record("cancel", len(result.cancelled),
                     f"Cancelled {len(result.cancelled)} queued job(s)", actor)
    return result


class JobNotQueuedError(LookupError):
    """A cancel of a job that is no longer queued; ``finished`` when the tables show it ran
    (a failed job, a kept result), False when it may never have existed."""

    def __init__(self, message: str, *, finished: bool) -> None:
        super().__init__(message)
        self.finished = finished


#: What :func:`cancel_job` did: deleted a job no worker held, or asked a running one to stop.
DELETED, STOPPING = "deleted", "stopping"


def cancel_job(job_id: str, *, actor: str = "", using: str | None = None) -> str:
    """Cancel one job: delete it if no worker holds it (freeing its unique lock) and return
    ``"deleted"``, or ask the running job to stop (``job.cancelled``) and return
    ``"stopping"``. :class:`JobNotQueuedError` says why a job that is not queued cannot be."""
    using = queue_database(using)
    for _ in range(3):  # the job may change state between the two statements
        row = QueuedJob.objects.using(using).filter(id=job_id).first()
        if row is None:
            raise _not_queued(job_id, using)
        if cancel([row], actor=actor, using=using).cancelled:
            return DELETED
        if job_queue.request_cancel(row.id, using=using):
            audit.record("cancel", 1, f"Asked running job {row.name} [{row.id}] to stop",
                         actor)
            return STOPPING
    raise _not_queued(job_id, using)


def _not_queued(job_id: str, using: str) -> JobNotQueuedError:
    """Why ``job_id`` cannot be cancelled, as precisely as the tables tell."""
    failed = FailedJob.objects.using(using).filter(id=job_id).first()
    if failed is not None:
        return JobNotQueuedError(f"Job {job_id} cannot be cancelled: it failed at "
                                 f"{failed.failed_at:%Y-%m-%d %H:%M:%S} and is in failed "
                                 f"jobs.", finished=True)
    result = JobResult.objects.using(using).filter(id=job_id).first()
    if result is not None:
        return JobNotQueuedError(f"Job {job_id} cannot be cancelled: it has finished "
                                 f"({result.status}).", finished=True)
    return JobNotQueuedError(f"Job {job_id} cannot be cancelled: it is not queued (it "
                             f"finished, or never existed).", finished=False)


def run_now(jobs: QueuedJobQuerySet) -> int:
    """Make delayed jobs due at once; reserved jobs are left to their worker."""
    return jobs.unreserved().update(available_at=Now())


@dataclass
class ClearResult:
    cleared: int
    locks_released: int


def clear(queues: Sequence[str] | None = None, *, keep_locks: bool = False, actor: str = "",
          using: str | None = None) -> ClearResult:
    """Delete waiting and delayed jobs (reserved ones finish) of ``queues`` or all queues, and
    free their unique locks unless ``keep_locks`` (Laravel's ``queue:clear`` keeps them).

    To free exactly the locks of the deleted rows, the rows are locked first (SKIP LOCKED), so
    one a worker claims meanwhile is neither deleted nor has its lock freed.
    """
    using = queue_database(using)
    rows = QueuedJob.objects.using(using).unreserved()
    if queues:
        rows = rows.filter(queue__in=list(queues))
    if keep_locks:
        cleared, payloads = rows._raw_delete(using), []
    else:
        payloads = _delete_locked(rows, using=using)
        cleared = len(payloads)
    released = sum(unique_jobs.release(unique_ref(payload)) for payload in payloads)
    if cleared:
        where = f"queue(s) {', '.join(queues)}" if queues else "all queues"
        locks = "unique locks kept" if keep_locks else f"{released} unique lock(s) released"
        audit.record("clear", cleared, f"Cleared {cleared} queued job(s) from {where} "
                     f"({locks})", actor)
    return ClearResult(cleared=cleared, locks_released=released)


def delete_unreserved(rows: QueuedJobQuerySet, *, using: str) -> list:
    """Delete the jobs of ``rows`` that no worker holds (one batch: the rows are locked,
    SKIP LOCKED) and return their payloads, whose unique locks the caller frees."""
    return _delete_locked(rows.unreserved(), using=using)


def _delete_locked(rows: QuerySet[QueuedJob], *, using: str, batch_size: int = 500) -> list:
    """Lock ``rows``, delete them in batches and return their payloads."""
    skip_locked = connections[using].features.has_select_for_update_skip_locked
    with transaction.atomic(using=using):
        found = list(rows.select_for_update(skip_locked=skip_locked).values_list("id",
                                                                                "payload"))
        for start in range(0, len(found), batch_size):
            chunk = [row_id for row_id, _ in found[start:start + batch_size]]
            QueuedJob.objects.using(using).filter(id__in=chunk)._raw_delete(using)
        for row_id, payload in found:
            workflows.finished(payload, outcome=workflows.SKIPPED, job_id=str(row_id),
                               using=using)
    return [payload for _, payload in found]


# -- requeueing an orphaned reservation ----------------------------------------------------

#: Why :func:`requeue` left a job alone.
WORKER_ALIVE, NOT_RESERVED = "worker_alive", "not_reserved"


@dataclass
class RequeueResult:
    """Jobs put back (``requeued``), and the ones left alone: held by a live worker
    (``alive``), or not reserved at all (``not_reserved``: waiting, delayed or gone)."""

    requeued: list[str]
    alive: list[str]
    not_reserved: list[str]


def requeue(job_ids: Iterable[Any], *, actor: str = "",
            using: str | None = None) -> RequeueResult:
    """Put jobs reserved by a worker that is gone back on the queue at once, as if their
    lease had run out now (the crashed run counts as an attempt, as it does then).

    Owner-checked: only a reservation whose worker is judged gone (its process on this host
    ended, or its row shows no heartbeat for ``RETRY_AFTER``) is requeued, by an UPDATE whose
    WHERE names that worker, and re-checks in SQL that the worker has not sent a heartbeat
    meanwhile (unless its process is known to have ended). A live worker's job is never
    taken from under it. A worker that has no row (housekeeping deleted it while the process
    was stopped, or an operator did) but whose job's lease is fresh counts as alive: the
    lease was renewed within ``RETRY_AFTER``, and a live worker registers again at its next
    heartbeat. If it is really gone, the lease runs out within ``RETRY_AFTER``.
    """
    using = queue_database(using)
    wanted = [str(job_id) for job_id in job_ids]
    valid = [job_id for job_id in wanted if _is_uuid(job_id)]
    rows = {str(row.id): row for row in QueuedJob.objects.using(using).filter(
        id__in=valid).with_state()}
    held = {job_id: row for job_id, row in rows.items() if row.state == "reserved"}
    states = worker_states({row.reserved_by for row in held.values()}, using=using)
    result = RequeueResult(requeued=[], alive=[], not_reserved=[])
    for job_id in wanted:
        row = held.get(job_id)
        if row is None:
            result.not_reserved.append(job_id)
            continue
        state = states.get(row.reserved_by, UNKNOWN)
        if state in (ALIVE, UNKNOWN):  # UNKNOWN: no worker row, but its lease is fresh
            result.alive.append(job_id)
            continue
        # A worker id names one process, so a dead worker's id never holds a job again.
        mine = QueuedJob.objects.using(using).filter(id=row.id, reserved_by=row.reserved_by)
        if state != ENDED:  # judged by its heartbeat: it must still be silent now
            mine = mine.exclude(Exists(Worker.objects.using(using).filter(
                id=OuterRef("reserved_by"),
                last_seen_at__gte=Now() - Value(heartbeat_grace()))))
        # Exactly what the lease running out now does: available_at = now, the holder kept
        # (reserved_by, reserved_at). The row is then waiting and claimable, and the next
        # claim sees it taken back from a worker that vanished (PostgreSQL's ``recovered``:
        # reserved_by <> ''), so that run starts with its attempt written even where batched
        # completion defers starts. Clearing reserved_by made that run's start deferred
        # again: a job that killed its worker, requeued each time, never spent a try.
        if mine.update(available_at=Now(), progress=None, progress_message="",
                       debounce_key=None):  # no longer folded into
            result.requeued.append(job_id)
        elif QueuedJob.objects.using(using).filter(id=row.id).reserved().exists():
            result.alive.append(job_id)  # its worker beat meanwhile
        else:
            result.not_reserved.append(job_id)  # it finished meanwhile
    if result.requeued:
        job_queue.notify({held[job_id].queue for job_id in result.requeued}, using=using)
        audit.record("requeue", len(result.requeued),
                     f"Requeued {len(result.requeued)} job(s) reserved by a worker that is "
                     f"gone", actor)
    return result


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


class RequeueRefused(LookupError):
    """:func:`requeue_job` could not requeue: ``code`` is ``worker_alive``,
    ``not_reserved`` or ``not_queued``."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


def requeue_job(job_id: str, *, actor: str = "", using: str | None = None) -> None:
    """Requeue one orphaned reservation (:func:`requeue`), or :class:`RequeueRefused` saying
    why not."""
    using = queue_database(using)
    row = QueuedJob.objects.using(using).filter(id=job_id).with_state().first() \
        if _is_uuid(job_id) else None
    if row is None:
        raise RequeueRefused(f"Job {job_id} is not queued (it finished, or never existed).",
                             code="not_queued")
    result = requeue([job_id], actor=actor, using=using)
    if result.alive:
        if not Worker.objects.using(using).filter(id=row.reserved_by).exists():
            raise RequeueRefused(
                f"Job {job_id} is reserved by worker {row.reserved_by}, which has no worker "
                f"row but renewed the job's lease within RETRY_AFTER, so it may still be "
                f"running it: it is not requeued under it (cancel it instead; if the worker "
                f"is gone, the lease runs out by itself).", code=WORKER_ALIVE)
        raise RequeueRefused(f"Job {job_id} is reserved by worker {row.reserved_by}, which is "
                             f"alive: it is not requeued under it (cancel it instead).",
                             code=WORKER_ALIVE)
    if result.not_reserved:
        raise RequeueRefused(f"Job {job_id} is not reserved by any worker ({row.state}); "
                             f"there is nothing to requeue (run it now instead).",
                             code=NOT_RESERVED)
