"""Batches: jobs dispatched together, with callbacks when they are done (Laravel's
``Bus::batch``, celery's ``group`` + ``chord``)::

    batch([ImportRows(f, n) for n in range(100)], name="import")
        .then(NotifyDone(f)).catch(AlertOps(f)).finally_(Cleanup(f)).dispatch()

A :class:`~django_jobguard.models.Batch` row counts the jobs. The pipeline calls
:func:`finished` in the transaction that acks a member or moves it to failed jobs; that
transaction locks the batch row, updates the counts and, when they say so, queues the
callbacks, which are jobs like any other. A callback is queued exactly once, even when the
last two members finish at the same instant on two workers: the row lock orders them and the
second sees the callback recorded in ``callbacks_queued``. A worker killed between the ack and
the commit loses nothing: neither happened, and the member runs again.

When the callbacks run (as in Laravel):

- ``then``: every job succeeded (a failed one that is retried and then succeeds counts).
- ``catch``: at the first job that fails for good.
- ``finally``: when every job has run once, whatever the outcome.

Without :meth:`PendingBatch.allow_failures`, the first failure cancels the batch: the jobs not
started yet are skipped (and counted as processed), ``then`` never runs, ``finally`` does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from django_jobguard import queue as job_queue
from django_jobguard.conf import queue_database
from django_jobguard.dialects import dialect_for
from django_jobguard.models import Batch

if TYPE_CHECKING:
    from django_jobguard.context import JobContext
    from django_jobguard.jobs import Job

__all__ = ["BatchHandle", "Batchable", "PendingBatch", "add", "batch", "cancel", "cancelled",
           "find", "finished", "retried"]

#: The payload key that marks a job as a batch member: the batch's id.
MARKER = "batch"
#: The payload key that marks a job as a batch's callback: the batch's id.
CALLBACK_MARKER = "batch_callback"
THEN, CATCH, FINALLY = "then", "catch", "finally"
SUCCEEDED, FAILED, SKIPPED = "succeeded", "failed", "skipped"


class Batchable:
    """Mixin for jobs that use their batch (Laravel's ``Batchable`` trait):
    ``self.batch`` is the :class:`BatchHandle` of the batch the job belongs to, or whose
    callback it is, ``None`` otherwise. ``class ImportRows(Batchable, Job)``."""

    #: The run's context (the job class it is mixed into has it).
    context: JobContext

    @property
    def batch(self) -> BatchHandle | None:
        extra = self.context.envelope.extra
        batch_id = extra.get(MARKER) or extra.get(CALLBACK_MARKER)
        return find(batch_id) if isinstance(batch_id, str) else None


class PendingBatch:
    """A batch being built; :func:`batch` makes one, :meth:`dispatch` queues it."""

    def __init__(self, jobs: Iterable[Job], *, name: str = "") -> None:
        self.jobs = list(jobs)
        self.name = name
        self.callbacks: dict[str, list[Job]] = {THEN: [], CATCH: [], FINALLY: []}
        self.failures_allowed = False

    def then(self, job: Job) -> PendingBatch:
        """Queue ``job`` when every job of the batch succeeded."""
        return self._add(THEN, job)

    def catch(self, job: Job) -> PendingBatch:
        """Queue ``job`` when the first job of the batch fails for good."""
        return self._add(CATCH, job)

    def finally_(self, job: Job) -> PendingBatch:
        """Queue ``job`` when every job of the batch has run, whatever the outcome."""
        return self._add(FINALLY, job)

    def allow_failures(self, allow: bool = True) -> PendingBatch:
        """Keep running the other jobs when one fails (default: the batch is cancelled)."""
        self.failures_allowed = allow
        return self

    def _add(self, kind: str, job: Job) -> PendingBatch:
        from django_jobguard.jobs import Job

        if not isinstance(job, Job):
            raise TypeError(f"batch().{kind}() takes a job (a Job instance, or a function "
                            f"job called with its arguments), not {job!r}.")
        self.callbacks[kind].append(job)
        return self

    def dispatch(self, *, using: str | None = None) -> BatchHandle:
        """Record the batch and queue its jobs, in the caller's transaction (one INSERT per
        500 jobs). Returns its :class:`BatchHandle`."""
        using = queue_database(using)
        row = Batch(id=uuid.uuid4(), name=self.name[:255],
                    allow_failures=self.failures_allowed,
                    callbacks={kind: [_encoded(job) for job in jobs]
                               for kind, jobs in self.callbacks.items() if jobs})
        rows = _members(row.id, self.jobs)
        row.total_jobs = row.pending_jobs = len(rows)
        with transaction.atomic(using=using):
            row.save(using=using, force_insert=True)
            job_queue.push(rows, using=using)
            locked = _locked(row.id, using) if not rows else None
            if locked is not None:  # an empty batch is done at once
                _settle(locked, using)
        row.refresh_from_db(using=using)
        return BatchHandle(row, job_ids=[str(r.id) for r in rows], using=using)


class BatchHandle:
    """A batch as its caller and its jobs see it (Laravel's ``Batch``): the counts of its
    :class:`~django_jobguard.models.Batch` row (``total_jobs``, ``pending_jobs``,
    ``failed_jobs``, ``processed_jobs``, ``progress``, ``status``, ``finished``,
    ``cancelled``… as last read: :meth:`refresh`), and what can be done to it."""

    def __init__(self, row: Batch, *, job_ids: Iterable[str] = (),
                 using: str | None = None) -> None:
        using = queue_database(using)
        self.row = row
        self.id = str(row.id)
        self.job_ids = list(job_ids)  # the jobs it was dispatched with
        self.using = using

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "row":
            raise AttributeError(name)
        return getattr(self.row, name)

    def __repr__(self) -> str:
        return f"<BatchHandle {self.id} {self.row.status} {self.row.processed_jobs}/" \
               f"{self.row.total_jobs}>"

    def refresh(self) -> BatchHandle:
        """Read the counts again."""
        self.row.refresh_from_db(using=self.using)
        return self

    def cancel(self) -> bool:
        """Cancel the batch: its jobs not started yet are skipped (each counted as
        processed), running ones finish. False if it was cancelled already."""
        return cancel(self.id, using=self.using)

    def add(self, jobs: Iterable[Job]) -> list[str]:
        """Add jobs to the batch (from one of its jobs); returns their ids."""
        return add(self.id, jobs, using=self.using)


def batch(jobs: Iterable[Job], *, name: str = "") -> PendingBatch:
    """``batch([A(1), A(2)]).then(B()).dispatch()``: run jobs together, then a callback."""
    return PendingBatch(jobs, name=name)


def find(batch_id: Any, *, using: str | None = None) -> BatchHandle | None:
    """The batch ``batch_id`` (``None`` if there is none, e.g. pruned)."""
    using = queue_database(using)
    try:
        row = Batch.objects.using(using).filter(id=batch_id).first()
    except (ValueError, TypeError, ValidationError):
        return None
    return BatchHandle(row, using=using) if row is not None else None


def marker_of(payload: Any) -> str | None:
    """The batch id of a member's payload, or ``None``."""
    if isinstance(payload, Mapping) and isinstance(payload.get(MARKER), str):
        return payload[MARKER]
    return None


def _encoded(job: Job) -> dict:
    """A job as a callback: what :func:`_settle` inserts when it is due."""
    from django_jobguard.jobs import build_row

    row, envelope = build_row(job)
    return {"job": row.name, "queue": row.queue, "priority": row.priority,
            "payload": envelope.replace(unique=None).as_json()}


def _members(batch_id: uuid.UUID, jobs: Iterable[Job]) -> list[job_queue.NewJob]:
    """The rows of ``jobs`` marked as members of ``batch_id`` (no unique locks: a batch
    queues its jobs itself)."""
    from django_jobguard.jobs import Job, build_row

    rows = []
    for job in jobs:
        if not isinstance(job, Job):
            raise TypeError(f"A batch holds jobs (Job instances), not {job!r}.")
        row, envelope = build_row(job)
        row.payload = envelope.replace(unique=None, extra={
            **envelope.extra, MARKER: str(batch_id)}).encode()
        rows.append(row)
    return rows


def add(batch_id: Any, jobs: Iterable[Job], *, using: str | None = None) -> list[str]:
    """Add ``jobs`` to a running batch (from inside one of its jobs, typically); they
    count before the job adding them finishes, so the batch cannot complete in between."""
    using = queue_database(using)
    rows = _members(uuid.UUID(str(batch_id)), jobs)
    with transaction.atomic(using=using):
        row = _locked(batch_id, using)
        if row is None:
            raise LookupError(f"No batch {batch_id}.")
        if row.all_ran and row.total_jobs:
            raise ValueError(f"Batch {batch_id} has finished; jobs cannot be added to it.")
        Batch.objects.using(using).filter(id=row.id).update(
            total_jobs=F("total_jobs") + len(rows), pending_jobs=F("pending_jobs") + len(rows))
        job_queue.push(rows, using=using)
    return [str(r.id) for r in rows]


def cancel(batch_id: Any, *, using: str | None = None) -> bool:
    """Cancel a batch: no job of it starts once this is committed (every worker reads the
    batch as it starts a member, after counting its attempt); running ones finish."""
    using = queue_database(using)
    done = bool(Batch.objects.using(using).filter(id=batch_id, cancelled_at__isnull=True)
                .update(cancelled_at=Now()))
    _remember_cancelled(batch_id, using)
    return done


#: Batches this process knows are cancelled (a cancel is for good, so no read is needed
#: again). That a batch is *not* cancelled is never remembered: it may be a moment later.
_cancelled_seen: set[tuple[str, str]] = set()


def _remember_cancelled(batch_id: Any, using: str) -> None:
    """The batch is cancelled: this process skips its members without asking again."""
    if len(_cancelled_seen) > 10_000:
        _cancelled_seen.clear()
    _cancelled_seen.add((using, str(batch_id)))


def cancelled(payload: Any, *, using: str | None = None) -> bool:
    """Is this job a member of a cancelled batch (the worker then skips it)?

    Read from the batch row each time a member starts (one primary-key read; no cache of
    "not cancelled"), after its attempt was counted: a member whose start follows a cancel's
    commit sees it, in every execution mode, so no job starts after ``cancel()`` returns."""
    using = queue_database(using)
    batch_id = marker_of(payload)
    if batch_id is None:
        return False
    if (using, batch_id) in _cancelled_seen:
        return True
    found = Batch.objects.using(using).filter(id=batch_id, cancelled_at__isnull=False).exists()
    if found:
        _remember_cancelled(batch_id, using)
    return found


def finished(payload: Any, *, outcome: str, job_id: str,
             using: str | None = None) -> None:
    """A member finished for good (call inside the transaction that acks or fails it):
    ``outcome`` is ``succeeded``, ``failed`` or ``skipped``. Updates the counts and queues
    the callbacks they call for."""
    using = queue_database(using)
    batch_id = marker_of(payload)
    if batch_id is None:
        return
    if outcome != FAILED:  # the common case: one statement, and the row only when it is done
        counted(batch_id, dialect_for(using).count_batch_success(batch_id), using=using)
        return
    row = _locked(batch_id, using)
    if row is None:
        return  # pruned by an operator: the job ran on its own
    row.failed_jobs += 1
    row.failed_job_ids = [*row.failed_job_ids, job_id]
    if not row.allow_failures and row.cancelled_at is None:
        row.cancelled_at = Now()
        _remember_cancelled(batch_id, using)
    row.save(using=using, update_fields=["failed_jobs", "failed_job_ids", "cancelled_at"])
    _settle(row, using, first_failure=row.failed_jobs == 1)


def counted(batch_id: str, counts: tuple[int, int] | None, *,
            using: str | None = None) -> None:
    """A member's success was counted (``counts``: the batch's ``(pending, failed)`` after
    it): when every job has run, queue the callbacks, under the batch row's lock.

    The pipeline counts a member in the statement that acks it and calls this after it
    (outside that transaction); if the worker dies in between, :func:`settle_finished`
    (the workers' housekeeping) queues the callbacks."""
    using = queue_database(using)
    if counts is not None and counts[0] <= counts[1]:  # pending <= failed: every job ran
        _settle_locked(batch_id, using)


def settle_finished(*, using: str | None = None) -> int:
    """Queue the callbacks of batches whose jobs have all run but which are not marked
    finished (a worker died between a member's ack and its batch's callbacks); how many."""
    using = queue_database(using)
    stuck = Batch.objects.using(using).filter(
        finished_at__isnull=True, pending_jobs__lte=F("failed_jobs")).values_list("id", flat=True)
    return sum(_settle_locked(batch_id, using) for batch_id in list(stuck[:100]))


def _locked(batch_id: Any, using: str) -> Batch | None:
    """The batch row, locked until the transaction ends (``None`` if there is none)."""
    return Batch.objects.using(using).select_for_update().filter(id=batch_id).first()


def _settle_locked(batch_id: Any, using: str) -> bool:
    """Lock the batch row and queue what its counts call for, unless it is settled or gone;
    whether it was settled now."""
    with transaction.atomic(using=using):
        row = _locked(batch_id, using)
        if row is None or row.finished_at is not None:
            return False
        _settle(row, using)
        return True


def _settle(row: Batch, using: str, *, first_failure: bool = False) -> None:
    """Queue the callbacks the counts of the locked ``row`` call for, each once."""
    due = []
    if first_failure:
        due.append(CATCH)
    if row.pending_jobs == 0 and row.failed_jobs == 0 and row.cancelled_at is None:
        due.append(THEN)
    if row.all_ran:
        due.append(FINALLY)
    due = [kind for kind in due if kind not in row.callbacks_queued]
    fields = []
    if row.all_ran and row.finished_at is None:
        row.finished_at = Now()
        fields.append("finished_at")
    if due:
        job_queue.push([job_queue.NewJob(
            name=cb["job"], queue=cb["queue"], priority=cb["priority"],
            payload=json.dumps({**cb["payload"], CALLBACK_MARKER: str(row.id)},
                               separators=(",", ":")))
            for kind in due for cb in row.callbacks.get(kind, [])], using=using)
        row.callbacks_queued = [*row.callbacks_queued, *due]
        fields.append("callbacks_queued")
    if fields:
        row.save(using=using, update_fields=fields)


def retried(payloads: list[Any], job_ids: list[str], *,
            using: str | None = None) -> None:
    """Failed members were queued again (inside the retry's transaction): they no longer
    count as failed, so a batch whose jobs then all succeed runs its ``then``."""
    using = queue_database(using)
    for payload, job_id in zip(payloads, job_ids, strict=True):
        batch_id = marker_of(payload)
        if batch_id is None:
            continue
        row = _locked(batch_id, using)
        if row is None or job_id not in row.failed_job_ids:
            continue
        row.failed_job_ids = [i for i in row.failed_job_ids if i != job_id]
        row.failed_jobs = max(0, row.failed_jobs - 1)
        row.finished_at = None  # it has a job to run again
        row.save(using=using, update_fields=["failed_job_ids", "failed_jobs", "finished_at"])
