"""Iterable jobs: a long job as items (or named steps), each committed with its checkpoint.

``IterableJob.handle()`` walks ``items(cursor)`` from the checkpoint the row holds. Each item
runs in **one transaction on the queue's database** with the write of its checkpoint to the
job's row: the item's own ORM writes and the checkpoint commit together or not at all. The
checkpoint write is owner-checked (this worker, this claim): a worker whose lease was lost
(another worker took the job) finds its row changed, and its item's transaction rolls back,
so no item is ever written twice. The same statement renews the row's lease (as the
heartbeat does): a run that commits items keeps its row even when its heartbeat is starved
(on SQLite the item transactions, back to back, can keep the heartbeat's write waiting past
``RETRY_AFTER``, and another worker then took the row from a live run and spent an attempt).

Between items the job stops when the worker stops gracefully (``job.stopping``: SIGTERM,
``--max-time``, a reload), when ``max_run_time`` has passed in this run, or when an operator
cancels it; it then goes back to the queue with its attempt unused and the next run resumes
after the last committed item. A hard kill loses only the item in flight (rolled back).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from django.db import transaction
from django.db.models import Value

from django_jobguard import clock
from django_jobguard.conf import jobguard_settings
from django_jobguard.exceptions import WorkerStoppedError
from django_jobguard.jobs import Job
from django_jobguard.models import QueuedJob

__all__ = ["IterableJob", "LeaseLostError", "after"]


class LeaseLostError(WorkerStoppedError):
    """An iterable job's checkpoint could not be written: its worker no longer holds the row
    (its lease ran out and another worker took it). The item's writes were rolled back."""

    reason = "lease_lost"
    detail = "its worker lost the row's lease; the item in flight was rolled back"


class IterableJob(Job):
    """A job made of items (``items()`` + ``each()``) or of named ``steps``, resumable.

    Override ``items(cursor)`` to yield ``(cursor, item)`` pairs after ``cursor`` (``None``
    at the start) and ``each(item)`` to process one item; or list ``steps`` and write a
    method per step. A cursor is JSON (an id, a string, a list). ``total()`` (optional)
    gives ``self.progress`` its denominator.
    """

    abstract = True
    #: Named steps run in order, each a method of that name; their cursor is the step's name.
    steps: ClassVar[tuple[str, ...]] = ()
    #: Seconds one run may go on before it stops between items and goes back to the queue
    #: (resuming at once, attempt unused); ``None``: until the items end.
    max_run_time: ClassVar[float | None] = None

    def items(self, cursor: Any) -> Iterable[tuple[Any, Any]]:
        """``(cursor, item)`` pairs after ``cursor``; the default walks ``steps``."""
        if not self.steps:
            raise NotImplementedError(f"{type(self).__name__} must implement items() and "
                                      f"each(), or list its steps.")
        start = 0 if cursor is None else list(self.steps).index(cursor) + 1
        return ((name, name) for name in self.steps[start:])

    def each(self, item: Any) -> None:
        """Process one item, inside the transaction that commits its checkpoint; the default
        runs the step method named ``item``."""
        if not self.steps:
            raise NotImplementedError(f"{type(self).__name__} must implement each().")
        getattr(self, item)()

    def total(self) -> int | None:
        """How many items there are in all (for progress), or ``None`` if unknown."""
        return len(self.steps) or None

    def finished(self) -> Any:
        """Called once every item is done (outside the items' transactions); its return
        value is the job's result."""
        return None

    # -- the iteration ---------------------------------------------------------------------

    @property
    def cursor(self) -> Any:
        """The cursor of the last committed item (``None`` before the first)."""
        checkpoint = self.context.checkpoint
        return checkpoint.get("cursor") if isinstance(checkpoint, dict) else None

    @property
    def items_done(self) -> int:
        """Items committed so far, in every run of the job."""
        checkpoint = self.context.checkpoint
        return int(checkpoint.get("done", 0)) if isinstance(checkpoint, dict) else 0

    def handle(self) -> Any:
        """Walk the items from the checkpoint, one transaction each (see the module)."""
        context = self.context
        if context.job_id is None:  # dispatch_sync(): no row to checkpoint
            for _, item in self.items(None):
                self.each(item)
            return self.finished()
        started = time.monotonic()
        total = self.total()
        for committed, (cursor, item) in enumerate(self.items(self.cursor)):
            if self._should_stop(started, committed):
                return self.interrupt()
            self._commit(cursor, item, total)
        return self.finished()

    def _should_stop(self, started: float, committed: int) -> bool:
        """Stop before the next item: the worker is stopping, an operator cancelled the job
        (it then ends as cancelled), or ``max_run_time`` passed (after one item at least, so
        that every run gets somewhere)."""
        if self.stopping or self.cancelled:
            return True
        return bool(self.max_run_time and committed
                    and time.monotonic() - started >= self.max_run_time)

    def _commit(self, cursor: Any, item: Any, total: int | None) -> None:
        """``each(item)`` and the checkpoint after it, in one transaction; the checkpoint's
        statement renews the lease too (see the module)."""
        context = self.context
        checkpoint = {"cursor": cursor, "done": self.items_done + 1}
        try:
            json.dumps(checkpoint)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{self.name}: the cursor {cursor!r} is not JSON ({exc}); "
                            f"yield ids or strings as cursors.") from None
        done = checkpoint["done"]
        assert context.job_id is not None  # handle() ran the items without a row otherwise
        lease = datetime.timedelta(seconds=float(jobguard_settings.RETRY_AFTER))
        with transaction.atomic(using=context.using):
            self.each(item)
            held = QueuedJob.objects.using(context.using).filter(
                id=context.job_id, reserved_by=context.worker_id, claims=context.claims)
            # The progress rides along: the admin shows how far the committed items got.
            if not held.update(checkpoint=checkpoint,
                               progress=min(done / total, 1.0) if total else None,
                               progress_message=f"{done} of {total} items" if total
                               else f"{done} items",
                               available_at=clock.db_now() + Value(lease)):
                raise LeaseLostError(LeaseLostError.detail)  # rolls the item back
        context.checkpoint = checkpoint


def after(queryset: Any, cursor: Any, *, key: str = "pk",
          chunk_size: int = 500) -> Iterator[tuple[Any, Any]]:
    """``(cursor, row)`` for the rows of ``queryset`` after ``cursor``, in ``key`` order: what
    ``items()`` returns for a queryset (``return after(Invoice.objects.all(), cursor)``).
    Rows are read in chunks, each chunk a fresh query after the last key seen."""
    last = cursor
    while True:
        rows = queryset.order_by(key)
        if last is not None:
            rows = rows.filter(**{f"{key}__gt": last})
        chunk = list(rows[:chunk_size])
        for row in chunk:
            last = getattr(row, key)
            yield last, row
        if len(chunk) < chunk_size:
            return
