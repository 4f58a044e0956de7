"""Fair share across a key (a tenant): ``JOBGUARD["QUEUES"]["reports"]["fair"] = True``.

A job's ``fair_key`` (a class attribute, a method computing it from the job's arguments, or
``dispatch(fair_key=...)``) is stored on its row. The claim of a fair queue serves the keys
that have due rows in turn, in the order of the key (the database's collation), each key
``fair_weights[key]`` rows (default 1) per turn; within a key, rows come in the usual claim
order (priority, then ``available_at``). The ranking is done by the claim statement itself
(dialects/: a skip scan of the keys after the cursor on PostgreSQL, a window function over
the queue's due rows on SQLite and MariaDB/MySQL), under SKIP LOCKED where the database has it.

Each worker process keeps a cursor per queue: the key served last, and how many rows of its
turn it used. The next claim starts there, so successive claims of one worker go round the
keys; the first starts at a random key, so that workers started together spread out.
Hence the bound (docs/scale-out.md#fair-share-across-tenants): while a key has a due row it
may take, it gets a row among the next ``W - w + 1`` rows any one worker claims from the
queue, ``W`` being the sum of the weights of the keys with due rows, ``w`` its own.

``per_key_concurrency = N`` caps the reserved rows (running, or claimed ahead) of each key at
``N`` across every worker: claims of such a queue take the queue's gate row (the mechanism of
``global_concurrency``, :mod:`django_jobguard.queue_caps`), so they count the reserved rows
per key and claim within the budget while no other claim of the queue runs.

Only queues configured fair (any of ``fair``, ``fair_weights``, ``per_key_concurrency``) use
this claim: the others keep the plain one, whatever their rows' ``fair_key``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django_jobguard.conf import jobguard_settings

if TYPE_CHECKING:
    from django_jobguard.models import QueuedJob

#: The keys of a queue's ``JOBGUARD["QUEUES"]`` entry this module reads.
FAIR_KEYS = frozenset({"fair", "fair_weights", "per_key_concurrency"})
#: The longest fair key (the column's length).
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class Cursor:
    """Where a worker's next claim of a fair queue starts: after ``key``, or at ``key``
    itself while ``used`` > 0 rows of its turn were served (its weight is larger)."""

    key: str = ""
    used: int = 0


@dataclass(frozen=True)
class FairClaim:
    """What a dialect's fair claim needs: the cursor, the weights, the per-key cap."""

    cursor: Cursor = Cursor()
    weights: dict[str, int] = field(default_factory=dict)
    per_key: int | None = None

    def weight(self, key: str) -> int:
        return self.weights.get(key, 1)

    def offset(self, key: str) -> int:
        """Rows of ``key``'s current turn already used (the cursor's key only)."""
        return self.cursor.used if key == self.cursor.key else 0


def config(queue: str) -> FairClaim | None:
    """The fair claim settings of ``queue`` (with a default cursor), or ``None`` when the
    queue is not fair."""
    queues = jobguard_settings.QUEUES
    entry = queues.get(queue) if queues else None
    if not entry or not any(entry.get(key) for key in FAIR_KEYS):
        return None
    return FairClaim(weights=dict(entry.get("fair_weights") or {}),
                     per_key=entry.get("per_key_concurrency"))


def key_of(job: Any, given: str | None = None) -> str:
    """The fair key of a dispatch: ``given`` (``dispatch(fair_key=...)``), else the job's
    ``fair_key`` (an attribute, or a method called with no arguments); ``""`` for none."""
    value = given if given is not None else getattr(job, "fair_key", None)
    if callable(value):
        value = value()
    if value is None:
        return ""
    if not isinstance(value, str):
        value = str(value)
    if len(value) > MAX_KEY_LENGTH:
        raise ValueError(f"{getattr(job, 'name', job)!r}: fair_key is {len(value)} characters, "
                         f"over {MAX_KEY_LENGTH}.")
    return value


# -- the cursors of this process -------------------------------------------------------------

_cursors: dict[tuple[str, str], Cursor] = {}
_lock = threading.Lock()
#: Whether a process's first claim of a queue starts at a random key (tests turn it off).
RANDOM_START = True
#: Rows a random start reads at most, from a random id on (:func:`_start`).
_START_SCAN = 1000


def _start(using: str, queue: str) -> Cursor:
    """Where this process's first claim of ``queue`` starts: after the key of the first row
    of the queue from a random id on (ids are random UUIDs), so that workers started
    together do not walk the same keys in step (each would take a key's first row, the
    other its second); the first key when none is found."""
    from django_jobguard.models import QueuedJob

    if not RANDOM_START:
        return Cursor()
    rows = QueuedJob.objects.using(using).filter(id__gte=uuid.uuid4()).order_by("id")
    for name, key in rows.values_list("queue", "fair_key")[:_START_SCAN]:
        if name == queue:
            return Cursor(key)
    return Cursor()


#: The most statements one fair claim runs to fill up (see :func:`claim`).
ROUNDS = 4


def claim(dialect: Any, queue: str, fair: FairClaim, *, limit: int,
          **options: Any) -> list[QueuedJob]:
    """Up to ``limit`` rows of ``queue`` in the fair order from this process's cursor, which
    then moves past what they served (``options`` as for ``Dialect.claim``).

    One statement takes each key's share of ``limit`` (``weight * ceil(limit / keys)``);
    when some keys have fewer due rows than that, it comes back short while the others have
    more. The claim then goes on from the moved cursor, up to :data:`ROUNDS` statements, until
    it is full or a statement finds nothing: a short claim tells the worker the backlog is
    gone (its next claim asks for one row), which would be false."""
    where = (dialect.using, queue)
    if where not in _cursors:
        first = _start(dialect.using, queue)
        with _lock:
            _cursors.setdefault(where, first)
    rows: list[QueuedJob] = []
    for _ in range(ROUNDS):
        with _lock:
            cursor = _cursors.get(where, Cursor())
        got = dialect.claim(queue, limit=limit - len(rows),
                            fair=FairClaim(cursor, fair.weights, fair.per_key), **options)
        if not got:
            break
        moved = advance(cursor, fair.weights, [row.fair_key for row in got])
        with _lock:
            _cursors[where] = moved
        rows += got
        if len(rows) >= limit:
            break
    return rows


def advance(cursor: Cursor, weights: dict[str, int], served: Sequence[str]) -> Cursor:
    """The cursor after a claim that served rows of the keys ``served``, in the claim's
    order: at the last key, with the rows of its turn it used (0 when the turn is complete,
    so the next claim starts after it)."""
    last = served[-1]
    count = sum(1 for key in served if key == last)
    offset = cursor.used if last == cursor.key else 0
    weight = weights.get(last, 1)
    used = (count - 1 + offset) % weight + 1
    return Cursor(last, 0 if used >= weight else used)


def fair_order(rows: list[QueuedJob], fair: FairClaim) -> list[QueuedJob]:
    """``rows`` (what one fair claim took: a prefix of the fair order) in that order, for a
    database whose statement cannot return it (SQLite: its BINARY collation orders keys as
    Python orders strings). Within a key, rows come by priority, then age (``created_at``:
    the claim overwrote ``available_at``)."""
    cursor = fair.cursor
    seen: dict[str, int] = {}
    ranked = []
    by_priority = sorted(rows, key=lambda row: (-row.priority, str(row.created_at)))
    for index, row in enumerate(by_priority):
        key = row.fair_key
        rank = seen[key] = seen.get(key, -1) + 1
        offset = fair.offset(key)
        turn = 0 if offset and key == cursor.key else (1 if key > cursor.key else 2)
        ranked.append(((rank + offset) // fair.weight(key), turn, key, rank, index, row))
    ranked.sort(key=lambda entry: entry[:5])
    return [entry[-1] for entry in ranked]


def reset() -> None:
    """Forget this process's cursors (tests)."""
    with _lock:
        _cursors.clear()
