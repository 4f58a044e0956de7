"""``drain()``: run the queued jobs in this process through the worker's pipeline.

Each job goes through :class:`~django_jobguard.worker.pipeline.Pipeline` as a worker would run it:
middleware, retries and backoff, failed jobs, unique locks, result rows. A job a job
dispatches is run too (``recursive=True``), until nothing is due.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.db.models import F, Q, Value

from django_jobguard import clock
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.models import QueuedJob
from django_jobguard.outcome import JobState
from django_jobguard.retry import Defaults
from django_jobguard.testing.commits import run_on_commit_callbacks
from django_jobguard.worker.pipeline import Pipeline

__all__ = ["DrainError", "DrainResult", "drain"]

#: Set while this thread runs jobs for drain() or inline mode (a job's own dispatches then wait
#: for the loop already running, instead of starting a run inside the run).
running = threading.local()


class DrainError(RuntimeError):
    """``drain()`` ran ``max_jobs`` jobs and the queue still had jobs due."""


@dataclass
class DrainResult:
    """How the jobs :func:`drain` ran ended; ``states`` lists each in the order run."""

    done: int = 0
    released: int = 0
    failed: int = 0
    skipped: int = 0
    deleted: int = 0
    lost: int = 0
    cancelled: int = 0
    states: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.states)

    def add(self, state: str) -> None:
        self.states.append(state)
        attribute = JobState(state).lower()  # a counter per state that ends a run
        setattr(self, attribute, getattr(self, attribute) + 1)


def worker_id(kind: str) -> str:
    """A worker id for rows reserved by a test helper (``drain:host:pid:hex``)."""
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _claimable(*, delayed: bool) -> Q:
    """Rows a worker could claim now; with ``delayed`` also the ones not due yet (but never a
    row another worker holds a lease on)."""
    due = Q(available_at__lte=clock.db_now())
    return due | Q(reserved_at__isnull=True) if delayed else due


def claim_row(job_id: uuid.UUID | str, *, worker_id: str, delayed: bool = False,
              using: str | None = None) -> QueuedJob | None:
    """Reserve the row ``job_id`` as a worker's claim does (attempt counted, lease taken);
    ``None`` if it is gone or not claimable."""
    using = queue_database(using)
    lease = datetime.timedelta(seconds=float(jobguard_settings.RETRY_AFTER))
    rows = QueuedJob.objects.using(using).filter(_claimable(delayed=delayed), id=job_id)
    now = clock.db_now()
    if not rows.update(attempts=F("attempts") + 1, reserved_at=now, reserved_by=worker_id,
                       claims=F("claims") + 1, available_at=now + Value(lease)):
        return None
    return QueuedJob.objects.using(using).filter(id=job_id, reserved_by=worker_id).first()


def _queues(queue: str | Sequence[str] | None) -> list[str] | None:
    if queue is None:
        return None
    if isinstance(queue, str):
        return [queue]
    return list(queue)


def drain(queue: str | Sequence[str] | None = None, recursive: bool = True,
          delayed: bool = False, *, max_jobs: int = 1000, tries: int = 1,
          timeout: float | None = None, backoff: Iterable[float] = (0.0,),
          using: str | None = None) -> DrainResult:
    """Run the due jobs of ``queue`` (a name, names, or every queue) in this process until
    none is due, and return how they ended.

    ``recursive=False`` runs only the jobs queued when ``drain()`` was called; ``delayed=True``
    also runs delayed and backed-off jobs without waiting for them. ``tries``, ``timeout`` and
    ``backoff`` are the worker's options for jobs that set none. :class:`DrainError` after
    ``max_jobs`` runs (a job that keeps releasing itself).
    """
    using = queue_database(using)
    if max_jobs < 1:
        raise ValueError(f"max_jobs must be at least 1, not {max_jobs}.")
    queues = _queues(queue)
    run_on_commit_callbacks()  # every alias: on_commit hooks the caller's
    base = QueuedJob.objects.using(using)
    if queues is not None:
        base = base.filter(queue__in=queues)
    first = set(base.values_list("id", flat=True)) if not recursive else None
    me = worker_id("drain")
    pipeline = Pipeline(worker_id=me, using=using, log_running=False, pause=lambda s: None,
                        defaults=Defaults(tries=tries, timeout=timeout, backoff=tuple(backoff)))
    result = DrainResult()
    outer = getattr(running, "active", False)
    running.active = True
    try:
        while True:
            candidates = base.filter(_claimable(delayed=delayed))
            if first is not None:
                candidates = candidates.filter(id__in=first)
            next_id = candidates.order_by("-priority", "available_at").values_list(
                "id", flat=True).first()
            if next_id is None:
                return result
            if result.total >= max_jobs:
                raise DrainError(
                    f"drain() ran {max_jobs} jobs and jobs are still due ({result}); a job "
                    "that keeps releasing itself? Raise max_jobs if this is expected.")
            row = claim_row(next_id, worker_id=me, delayed=delayed, using=using)
            if row is None:
                continue
            result.add(pipeline.process(row))
            run_on_commit_callbacks()  # every alias: on_commit hooks the caller's
    finally:
        running.active = outer
