"""Debounced jobs: dispatches of one key within a window fold into one waiting job.

A job declares ``debounce = (seconds, max_wait)`` (or ``dispatch(debounce=...)``), keyed like
a unique job by ``debounce_id()`` (default: one per job name). The first dispatch of a key
inserts a row due in ``seconds``; each later dispatch while that row waits (no worker has
taken it) **replaces its arguments** (last wins), moves its due time to ``seconds`` from now,
but never past ``max_wait`` from the first dispatch (the row's ``debounce_deadline``), and
counts one more fold. A dispatch after a worker took the row queues a new one.

Atomic under concurrent dispatch: the row holds its key in ``debounce_slot``, a column the
database keeps (the key while ``reserved_at`` is NULL, else NULL) under a unique index, so at
most one row per key waits. A dispatch updates the waiting row of its key; when there is none
it inserts one, and if a concurrent dispatch inserted it first the unique index refuses the
second insert and the dispatch folds into the winner instead. Times come from the database
clock.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.db.models import F, Value
from django.db.models.functions import Least
from django.utils import timezone

from django_jobguard import clock, durations, keys
from django_jobguard import queue as job_queue
from django_jobguard.models import QueuedJob

if TYPE_CHECKING:
    from django_jobguard.dialects import NewJob

logger = logging.getLogger("django_jobguard.debounce")

__all__ = ["Debounce", "fold_or_push", "key_for", "parse"]


@dataclass(frozen=True)
class Debounce:
    """``seconds`` of quiet before the job runs, and ``max_wait``: the most it is put off
    from its first dispatch."""

    seconds: float
    max_wait: float


def parse(value: Any, *, name: str = "debounce") -> Debounce | None:
    """A :class:`Debounce` from ``(seconds, max_wait)`` (numbers or timedeltas), ``None``
    for ``None``; ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    if value is None or isinstance(value, Debounce):
        return value
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be (seconds, max_wait), not {value!r}.")
    seconds = durations.seconds(value[0], name=f"{name} seconds")
    max_wait = durations.seconds(value[1], name=f"{name} max_wait")
    if seconds <= 0:
        raise ValueError(f"{name} seconds must be more than 0, not {value[0]!r}.")
    if max_wait < seconds:
        raise ValueError(f"{name} max_wait ({value[1]!r}) must be at least its seconds "
                         f"({value[0]!r}).")
    return Debounce(seconds=seconds, max_wait=max_wait)


def key_for(job: Any) -> str:
    """The debounce key of ``job``: ``jobguard:debounce:<job name>:<debounce_id()>``."""
    debounce_id = getattr(job, "debounce_id", None)
    return keys.debounce(job.name, debounce_id() if callable(debounce_id) else "")


#: Tries of one dispatch that keeps meeting concurrent ones (each try folds or inserts; only
#: a race lost twice in a row, or a deadlock on MariaDB, takes another).
_ROUNDS = 50


def fold_or_push(row: NewJob, key: str, debounce: Debounce, *, using: str) -> tuple[str, bool]:
    """Fold ``row``'s payload into the waiting row of ``key``, or insert ``row`` as that row:
    ``(the id of the row that will run, whether it was folded)``.

    Inside a caller's transaction a lost race is retried in a savepoint; outside one a
    deadlock (MariaDB: two dispatches inserting the same new key) retries the whole dispatch.
    """
    own = not connections[using].in_atomic_block
    for attempt in range(_ROUNDS):
        try:
            with transaction.atomic(using=using):
                return _fold_or_push(row, key, debounce, using=using)
        except IntegrityError:
            continue  # a concurrent dispatch inserted the waiting row first: fold into it
        except OperationalError as exc:
            if not own or not _deadlock(exc):
                raise
            time.sleep(0.001 * (attempt + 1))
    raise DatabaseError(f"Debounced dispatch of {key} kept losing races with concurrent "
                        f"dispatches ({_ROUNDS} tries).")


def _deadlock(exc: OperationalError) -> bool:
    code = exc.args[0] if exc.args else None
    return code in (1213, 1205) or "deadlock" in str(exc).lower() \
        or "database is locked" in str(exc)


def _fold_or_push(row: NewJob, key: str, debounce: Debounce, *, using: str) -> tuple[str, bool]:
    now = clock.db_now()
    waiting = QueuedJob.objects.using(using).filter(debounce_slot=key)
    folded = waiting.update(
        payload=json.loads(row.payload),
        available_at=Least(now + Value(datetime.timedelta(seconds=debounce.seconds)),
                           F("debounce_deadline")),
        debounce_folds=F("debounce_folds") + 1, tags=row.tags)  # the last dispatch's
    if folded:  # the row is ours (locked) until the transaction ends
        return str(waiting.values_list("id", flat=True).get()), True
    job_queue.push([row], using=using)
    QueuedJob.objects.using(using).filter(id=row.id).update(
        debounce_key=key,
        debounce_deadline=now + Value(datetime.timedelta(seconds=debounce.max_wait)))
    return str(row.id), False


def describe(row: QueuedJob) -> str:
    """``debounced: runs at …, N dispatches folded`` for the admin; ``""`` if not debounced."""
    if not row.debounce_key:
        return ""
    folds = row.debounce_folds
    at = timezone.localtime(row.available_at).strftime("%Y-%m-%d %H:%M:%S")
    latest = (f" (at the latest {timezone.localtime(row.debounce_deadline):%H:%M:%S})"
              if row.debounce_deadline else "")
    return f"debounced: runs at {at}{latest}, {folds} dispatch{'es' if folds != 1 else ''} folded"
