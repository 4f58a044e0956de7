"""Global per-queue concurrency: ``JOBGUARD["QUEUES"]["reports"]["global_concurrency"] = 2``.

At most that many jobs of the queue run at once across every worker and host. The cap is
kept by the database, not by the workers: a claim of a capped queue opens a transaction,
takes the lock of the queue's :class:`~django_jobguard.models.QueueGate` row (an UPDATE, so
it is a row lock on PostgreSQL and MariaDB/MySQL and the write lock on SQLite), counts the
queue's reserved rows whose lease has not run out, and claims at most the difference before
it commits. Claims of that queue therefore take turns; claims of other queues do not wait.

Every reserved row counts, rows claimed ahead too, so claiming ahead never breaks the cap; a
row whose worker died counts until its lease runs out (``RETRY_AFTER``), as it may still be
running.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import IntegrityError, transaction

from django_jobguard import clock
from django_jobguard.conf import jobguard_settings
from django_jobguard.fair_share import FAIR_KEYS
from django_jobguard.models import QueuedJob, QueueGate

#: The keys a queue's entry in ``JOBGUARD["QUEUES"]`` may have (the fair share ones are
#: read by :mod:`django_jobguard.fair_share`).
QUEUE_KEYS = frozenset({"global_concurrency", "max_wait", "max_failure_rate",
                        "worker_concurrency"}) | FAIR_KEYS


#: What :func:`gate` yields without a cap.
UNLIMITED = 2**31 - 1


def global_concurrency(queue: str) -> int | None:
    """The cap of ``queue`` across all workers, or ``None`` (no cap)."""
    queues = jobguard_settings.QUEUES
    if not queues:
        return None
    config = queues.get(queue)
    return config.get("global_concurrency") if config else None


@contextmanager
def gate(queue: str, cap: int | None, *, using: str) -> Iterator[int]:
    """In a transaction holding ``queue``'s gate row: yields how many more of its jobs may
    start now (claim them before the block ends). Without a ``cap`` (a queue gated for its
    ``per_key_concurrency``, counted by the fair claim itself) that is unlimited."""
    with transaction.atomic(using=using):
        gates = QueueGate.objects.using(using)
        if not gates.filter(queue=queue).update(claimed_at=clock.db_now()):
            try:
                with transaction.atomic(using=using):
                    gates.create(queue=queue)
            except IntegrityError:  # another claim created it first
                pass
            gates.filter(queue=queue).update(claimed_at=clock.db_now())
        if cap is None:
            yield UNLIMITED
            return
        running = QueuedJob.objects.using(using).filter(
            queue=queue, reserved_at__isnull=False, available_at__gt=clock.db_now()).count()
        yield max(cap - running, 0)
