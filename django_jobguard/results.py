"""Job results: the :class:`~django_jobguard.models.JobResult` row of a job that keeps one.

A result goes READY (queued) → RUNNING (a worker started it) → SUCCESSFUL or FAILED, and back
to READY when a retry is queued. Every run appends its worker id and every exception an error,
so the row tells the whole story. The worker and the django.tasks backend write it only here.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.dialects import dialect_for
from django_jobguard.envelope import encoded_size
from django_jobguard.exceptions import class_path, traceback_text
from django_jobguard.models import FailedJob, JobResult, QueuedJob

READY, RUNNING, SUCCESSFUL, FAILED = "READY", "RUNNING", "SUCCESSFUL", "FAILED"
FINISHED = (SUCCESSFUL, FAILED)

logger = logging.getLogger("django_jobguard.worker")


def error_entry(exception: BaseException) -> dict[str, str]:
    """An error as django.tasks' ``TaskError`` stores it: class path and traceback."""
    return {"exception_class_path": class_path(exception),
            "traceback": traceback_text(exception)}


def _jsonable(value: Any, job_id: Any = None) -> Any:
    """``value`` as the row keeps it: its ``repr()`` when it is not JSON, and a note instead
    of it when its JSON is over ``JOBGUARD['MAX_RESULT_BYTES']`` (the job still succeeded)."""
    try:
        size = encoded_size(value)
    except (TypeError, ValueError):
        value = repr(value)
        size = encoded_size(value)
    limit = jobguard_settings.MAX_RESULT_BYTES
    if limit and size > limit:
        logger.warning("The result of job %s was not stored: %d bytes of JSON, over "
                       "JOBGUARD['MAX_RESULT_BYTES'] = %d.", job_id, size, limit)
        return too_large_note(size, limit)
    return value


def too_large_note(size: int, limit: int) -> str:
    """What a result row stores instead of a return value over ``MAX_RESULT_BYTES``."""
    return (f"[result not stored: {size} bytes of JSON, over JOBGUARD['MAX_RESULT_BYTES'] = "
            f"{limit}]")


def _locked(job_id: Any, using: str) -> JobResult | None:
    return JobResult.objects.using(using).select_for_update().filter(id=job_id).first()


def create_ready(*, job_id: Any, name: str, queue: str, payload: dict[str, Any],
                 enqueued_at: datetime.datetime, using: str | None = None) -> JobResult:
    """The READY row written beside a newly queued job (same transaction)."""
    using = queue_database(using)
    return JobResult.objects.using(using).create(
        id=job_id, name=name, queue=queue, status=READY, payload=payload,
        enqueued_at=enqueued_at, errors=[], worker_ids=[],
    )


def mark_running(job_id: Any, *, worker_id: str, attempt: int,
                 defaults: dict[str, Any] | None = None,
                 using: str | None = None) -> JobResult:
    """A worker starts running the job: RUNNING, its id appended, start times set.

    ``defaults`` fill a row that does not exist yet (a failed job retried after its result
    was pruned).
    """
    using = queue_database(using)
    now = timezone.now()
    with transaction.atomic(using=using):
        result = _locked(job_id, using)
        if result is None:
            result = JobResult(id=job_id, errors=[], worker_ids=[], **(defaults or {}))
        result.status = RUNNING
        result.worker_ids = [*result.worker_ids, worker_id]
        result.attempts = attempt
        result.started_at = result.started_at or now
        result.last_attempted_at = now
        result.finished_at = None
        result.save(using=using)
    return result


def mark_ready(row: QueuedJob, *, worker_id: str, ran: bool,
               exception: BaseException | None = None,
               using: str | None = None) -> JobResult | None:
    """The job went back to the queue (a retry or a deferral): READY, the error kept."""
    using = queue_database(using)
    return _merge(row, status=READY, worker_id=worker_id, ran=ran, exception=exception,
                  using=using)


def mark_finished(row: QueuedJob, *, status: str, worker_id: str, ran: bool,
                  started_at: datetime.datetime | None = None, return_value: Any = None,
                  exception: BaseException | None = None, only_existing: bool = False,
                  using: str | None = None) -> JobResult | None:
    """The job ended for good (SUCCESSFUL or FAILED). Earlier workers and errors stay."""
    using = queue_database(using)
    result = _merge(row, status=status, worker_id=worker_id, ran=ran, started_at=started_at,
                    return_value=return_value, exception=exception,
                    only_existing=only_existing, using=using)
    if result is not None:  # wake handle.wait() once the caller's transaction commits
        dialect_for(using).notify_result(row.id)
    return result


def _merge(row: QueuedJob, *, status: str, worker_id: str, ran: bool,
           started_at: datetime.datetime | None = None, return_value: Any = None,
           exception: BaseException | None = None, only_existing: bool = False,
           using: str | None = None) -> JobResult | None:
    """Fold one outcome into the job's result row, creating it if needed.

    ``ran`` says whether ``handle()`` ran this time, so the worker id counts as an attempt
    unless :func:`mark_running` recorded it already.
    """
    using = queue_database(using)
    now = timezone.now()
    with transaction.atomic(using=using):
        result = _locked(row.id, using)
        if result is None:
            if only_existing:
                return None
            result = JobResult(id=row.id, name=row.name, queue=row.queue, errors=[],
                               worker_ids=[], enqueued_at=row.created_at)
        if ran and result.attempts < row.attempts:  # nobody recorded this run yet
            result.worker_ids = [*result.worker_ids, worker_id]
            result.last_attempted_at = started_at or row.reserved_at or now
        if ran:
            result.started_at = result.started_at or started_at or row.reserved_at or now
        result.status = status
        result.attempts = max(result.attempts, row.attempts if ran else 0)
        result.return_value = _jsonable(return_value, row.id) if status == SUCCESSFUL else None
        if exception is not None:
            result.errors = [*result.errors, error_entry(exception)]
        result.finished_at = now if status in FINISHED else None
        result.save(using=using)
    return result


#: Polling of :func:`wait_finished` where there is no LISTEN: the first look after this many
#: seconds, each next one half as late again, at most :data:`POLL_MAX` apart.
POLL_FIRST = 0.02
POLL_MAX = 0.5
#: With LISTEN, the result is also read at least this often (a NOTIFY lost with a dropped
#: connection, or a pooler in between, only delays the wake-up).
LISTEN_RECHECK = 1.0


def wait_finished(job_id: Any, *, timeout: float | None, using: str | None = None
                  ) -> JobResult | FailedJob:
    """Block until job ``job_id`` has finished: its SUCCESSFUL or FAILED result row (or its
    failed job, when it failed without a result row). Woken by NOTIFY on PostgreSQL, polling
    elsewhere. ``TimeoutError`` after ``timeout`` seconds (``None``: no limit);
    ``LookupError`` when the job is nowhere (never queued here, or its result was pruned)."""
    using = queue_database(using)
    deadline = None if timeout is None else time.monotonic() + timeout
    listener = dialect_for(using).listen_results()
    try:
        pause = POLL_FIRST
        while True:
            found = _finished(job_id, using)
            if found is not None:
                return found
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"Job {job_id} did not finish within {timeout:g} s.")
            if listener is not None:
                step = LISTEN_RECHECK if left is None else min(LISTEN_RECHECK, left)
                listener.wait(step)  # any result written: look (ours is read from the row)
            else:
                time.sleep(pause if left is None else min(pause, left))
                pause = min(pause * 1.5, POLL_MAX)
    finally:
        if listener is not None:
            listener.close()


def _finished(job_id: Any, using: str) -> JobResult | FailedJob | None:
    """The finished result of ``job_id``, its failed job, or ``None`` while it is queued
    (``LookupError`` when it is nowhere)."""
    result = JobResult.objects.using(using).filter(id=job_id).first()
    if result is not None and result.status in FINISHED:
        return result
    if QueuedJob.objects.using(using).filter(id=job_id).exists():
        return None
    failed = FailedJob.objects.using(using).filter(id=job_id).first()
    if failed is not None:
        return failed
    result = JobResult.objects.using(using).filter(id=job_id).first()  # finished meanwhile
    if result is not None and result.status in FINISHED:
        return result
    raise LookupError(f"Job {job_id} is neither queued nor finished here (never queued on "
                      f"this database, or its result was pruned or deleted).")


def prune(*, older_than: datetime.timedelta, using: str | None = None) -> int:
    """Delete finished results older than ``older_than``, and results of jobs that no longer
    exist anywhere (cleared from the queue) enqueued before then. Returns how many."""
    using = queue_database(using)
    cutoff = timezone.now() - older_than
    finished = JobResult.objects.using(using).filter(status__in=FINISHED, finished_at__lt=cutoff)
    count = finished._raw_delete(using)
    orphans = JobResult.objects.using(using).filter(
        ~Q(status__in=FINISHED), enqueued_at__lt=cutoff
    ).exclude(id__in=QueuedJob.objects.using(using).values("id")).exclude(
        id__in=FailedJob.objects.using(using).values("id"))
    return count + orphans._raw_delete(using)
