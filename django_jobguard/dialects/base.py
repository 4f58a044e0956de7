"""The interface every database dialect implements: the storage primitives of the queue
(push, claim, ack, NOTIFY/LISTEN) and of the database store (lock upsert and release,
throttle row locks), plus the database clock they all measure time with.

A dialect serves one connection alias and holds no connection or cursor: Django connections
are per thread, so each primitive takes ``connections[self.using]`` when it runs. What it
caches is SQL text, which is the same for every thread.
"""

from __future__ import annotations

import datetime
import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Q
from django.db.models.base import ModelState
from django.db.models.signals import post_init

from django_jobguard.envelope import UndecodedPayload
from django_jobguard.fair_share import FairClaim
from django_jobguard.models import COUNTER_MAX, PausedQueue, QueuedJob

#: ``RunStatistic``'s conflict target and the columns an upsert merges.
STATISTIC_KEY = ("span", "period", "name", "queue", "bucket")
STATISTIC_MERGED = ("runs", "failures", "runtimes", "waits", "runtime_min", "runtime_max",
                    "wait_min", "wait_max")


@dataclass(slots=True)
class NewJob:
    """A job about to be inserted (built by dispatch, inserted by :meth:`Dialect.push`)."""

    name: str
    queue: str
    payload: str          # the job's envelope, already encoded: compact JSON text, stored as is
    priority: int = 0
    at: datetime.datetime | None = None   # run at this aware time, or
    delay: float | None = None            # this many seconds after the database's now
    id: uuid.UUID = field(default_factory=uuid.uuid4)
    fair_key: str = ""    # the key a fair queue takes turns between (fair_share.py)
    #: Its tags as the column stores them (``,a,b,``, :mod:`django_jobguard.tags`); the
    #: dialects insert the other columns and :func:`django_jobguard.queue.push` sets these.
    tags: str = ""


def _held(pairs: Iterable[tuple[Any, int]]) -> Q:
    """A filter for the rows ``pairs`` names, each ``(id, claims)``: a row still in the
    claim that left it ``claims`` (matches nothing when ``pairs`` is empty)."""
    found = Q(pk__in=[])
    for job_id, claims in pairs:
        found |= Q(id=job_id, claims=claims)
    return found


def clock_value(value: Any) -> datetime.datetime:
    """The database clock as a driver returned it (an aware or naive UTC datetime, or ISO text
    on SQLite), as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return value


#: Where the payload is among the queue table's concrete columns (the order claims read them).
PAYLOAD_INDEX = [f.name for f in QueuedJob._meta.concrete_fields].index("payload")
#: Where an iterable job's checkpoint is (JSON the claim decodes, see :func:`job_from_values`).
CHECKPOINT_INDEX = [f.name for f in QueuedJob._meta.concrete_fields].index("checkpoint")


@dataclass(frozen=True)
class ThrottleRow:
    """What a locked throttle row holds for the counters (see stores/counters.py)."""

    key: str
    data: str
    value: float
    state: str


class ListenUnavailable(Exception):
    """LISTEN cannot wake this worker: the listening connection never hears a NOTIFY (a
    transaction-pooling PgBouncer in between), or the settings say it would not. The message
    says why and what to set; the worker polls instead."""


class Listener(ABC):
    """A connection that waits for NOTIFY, so idle workers wake as soon as a job is pushed."""

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """True when a notification arrived within ``timeout`` seconds."""

    @abstractmethod
    def close(self) -> None:
        """Close the listening connection (never raises)."""


class ResultListener(ABC):
    """A connection that hears which jobs' results were just written."""

    @abstractmethod
    def wait(self, timeout: float) -> set[str]:
        """The job ids whose results were written within ``timeout`` seconds (empty: none)."""

    @abstractmethod
    def close(self) -> None:
        """Close the listening connection (never raises)."""


class Dialect(ABC):
    """The primitives one database backend needs, for the connection alias ``using``."""

    def __init__(self, using: str) -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"<{type(self).__name__} using={self.using!r}>"

    # -- clock -----------------------------------------------------------------------------

    @abstractmethod
    def now(self) -> datetime.datetime:
        """The database clock, aware (UTC): what every visibility and expiry is measured by."""

    # -- queue -----------------------------------------------------------------------------

    @abstractmethod
    def push(self, jobs: Sequence[NewJob], *, batch_size: int) -> None:
        """Insert ``jobs`` (payload text as it is), ``batch_size`` rows per statement, and
        notify listeners where the database can (delivered when the transaction commits)."""

    def notify(self, queues: Iterable[str]) -> None:
        """Wake workers listening on ``queues`` (after commit); a no-op without NOTIFY."""
        return None

    @abstractmethod
    def claim(self, queue: str, *, worker_id: str, limit: int, lease: float,
              count_attempts: bool = True, fair: FairClaim | None = None) -> list[QueuedJob]:
        """Lease up to ``limit`` due rows of ``queue`` to ``worker_id`` for ``lease`` seconds
        (one attempt counted each, unless ``count_attempts=False``: rows claimed ahead, whose
        attempt counts when they start). A payload that does not decode stays text.

        With ``fair`` (a fair queue, :mod:`django_jobguard.fair_share`) the rows are the first
        ``limit`` of the fair order from its cursor, returned in that order, each key's
        reserved rows kept within ``fair.per_key`` (the caller holds the queue's gate)."""

    @abstractmethod
    def ack(self, job_id: Any, reserved_by: str, claims: int, *, relaxed: bool = False) -> bool:
        """Delete the row ``job_id`` if ``reserved_by`` still holds it from the claim that
        left its ``claims`` count at ``claims``. ``relaxed``: the commit need not wait for the
        database to flush it to disk, where the dialect can say so for one transaction
        (PostgreSQL; see ``SYNCHRONOUS_ACKS``); others ignore it."""

    def start(self, job_id: Any, reserved_by: str, claims: int, *,
              relaxed: bool = False) -> bool:
        """Count the attempt of ``job_id``, claimed ahead, as it starts, if ``reserved_by``
        still holds it from the claim that left ``claims`` (``relaxed`` as for :meth:`ack`)."""
        from django.db.models import F

        return bool(QueuedJob.objects.using(self.using).filter(
            id=job_id, reserved_by=reserved_by, claims=claims).update(
            attempts=F("attempts") + 1))

    def start_many(self, starts: Sequence[tuple[Any, int]], reserved_by: str, *,
                   relaxed: bool = False) -> set[Any]:
        """:meth:`start` for several rows (each ``(id, claims)``) at once; the ids of those
        still held by ``reserved_by``, counted (the others were taken over: not started)."""
        from django.db import transaction
        from django.db.models import F

        if not starts:
            return set()
        held = QueuedJob.objects.using(self.using).filter(_held(starts),
                                                         reserved_by=reserved_by)
        with transaction.atomic(using=self.using):
            ids = set(held.select_for_update().values_list("id", flat=True))
            if ids:
                held.filter(id__in=ids).update(attempts=F("attempts") + 1)
        return ids

    def ack_and_start(self, job_id: Any, reserved_by: str, claims: int, start_id: Any,
                      start_claims: int, *, relaxed: bool = False) -> tuple[bool, bool]:
        """Ack ``job_id`` and count the attempt of ``start_id``, the row claimed ahead that
        the worker runs next (both owner-checked): ``(acked, started)``. One round trip
        where the dialect can (the default: two statements in one transaction)."""
        from django.db import transaction

        with transaction.atomic(using=self.using):
            acked = self.ack(job_id, reserved_by, claims, relaxed=relaxed)
            started = self.start(start_id, reserved_by, start_claims, relaxed=relaxed)
        return acked, started

    #: Whether :meth:`claim` marks each row with ``recovered`` (True: its lease ran out in
    #: another claim, the worker holding it vanished), which batched completion needs
    #: (:mod:`django_jobguard.worker.completer`).
    marks_recovered = False

    def complete(self, done: Sequence[tuple[Any, int]], starts: Sequence[tuple[Any, int]],
                 reserved_by: str, *, relaxed: bool = False) -> tuple[set[Any], set[Any]]:
        """A completion group: delete the finished rows ``done`` and count the attempts of
        the running rows ``starts`` (each ``(id, claims)``), owner-checked like :meth:`ack`
        and :meth:`start`, atomically: ``(ids acked, ids started)``. Default: two
        statements in one transaction."""
        from django.db import transaction
        from django.db.models import F

        rows = QueuedJob.objects.using(self.using).filter(reserved_by=reserved_by)
        with transaction.atomic(using=self.using):
            acked = set(rows.filter(_held(done)).values_list("id", flat=True)) if done else set()
            if acked:
                rows.filter(id__in=acked)._raw_delete(self.using)
            started = set(rows.filter(_held(starts)).values_list("id", flat=True)) \
                if starts else set()
            if started:
                rows.filter(id__in=started).update(attempts=F("attempts") + 1)
        return acked, started

    def notify_result(self, job_id: Any) -> None:
        """Wake callers waiting for ``job_id``'s result (after commit); a no-op without
        NOTIFY (the waiters poll)."""
        return None

    def listen_results(self, via: str | None = None) -> ResultListener | None:
        """A :class:`ResultListener` on its own connection, or ``None`` where there is no
        LISTEN (the waiter polls)."""
        return None

    def listen(self, via: str | None = None) -> Listener | None:
        """A :class:`Listener` on its own connection (to the alias ``via``, default this
        dialect's), or ``None`` where there is no LISTEN; raises :class:`ListenUnavailable`
        when a NOTIFY sent to this dialect's database does not reach it."""
        return None

    def job_exists(self, job_id: uuid.UUID) -> bool:
        """Whether the row ``job_id`` exists, waiting for a transaction that is inserting it
        (see :func:`django_jobguard.queue.exists`). Default: insert the id in a savepoint,
        always rolled back; a duplicate key waits for the inserting transaction to end."""
        from django.db import IntegrityError, transaction

        try:
            with transaction.atomic(using=self.using):
                QueuedJob(id=job_id, name="", queue="").save(using=self.using, force_insert=True)
                transaction.set_rollback(True, using=self.using)
        except IntegrityError:
            return True
        return False

    # -- batches (batches.py) --------------------------------------------------------------

    def ack_counting(self, job_id: Any, reserved_by: str, claims: int, start_id: Any,
                     start_claims: int | None, batch_id: Any, *,
                     relaxed: bool = False) -> tuple[bool, bool, tuple[int, int] | None]:
        """:meth:`ack` (or :meth:`ack_and_start` when ``start_id``) of a batch member and
        its success counted in the batch, atomically: ``(acked, started, (pending, failed)
        or None)``. One round trip where the dialect can (default: one transaction)."""
        from django.db import transaction

        with transaction.atomic(using=self.using):
            if start_id is None:
                acked, started = self.ack(job_id, reserved_by, claims, relaxed=relaxed), False
            else:
                acked, started = self.ack_and_start(job_id, reserved_by, claims, start_id,
                                                    start_claims, relaxed=relaxed)
            counts = self.count_batch_success(batch_id) if acked else None
        return acked, started, counts

    def count_batch_success(self, batch_id: Any) -> tuple[int, int] | None:
        """One member of batch ``batch_id`` succeeded: ``pending_jobs - 1``, inside the
        caller's transaction (the row stays locked until it ends); the new ``(pending,
        failed)``, or ``None`` without such a batch. Default: an UPDATE, then a SELECT."""
        from django.db.models import F

        from django_jobguard.models import Batch

        rows = Batch.objects.using(self.using).filter(id=batch_id)
        rows.filter(pending_jobs__gt=0).update(pending_jobs=F("pending_jobs") - 1)
        return rows.values_list("pending_jobs", "failed_jobs").first()

    # -- the dashboard (history.py, operations/monitoring.py) -------------------------------

    def add_queue_counts(self, minute: datetime.datetime,
                         counts: Sequence[tuple[str, int, int]]) -> None:
        """Add ``(queue, done, failed)`` to the ``QueueMinute`` rows of ``minute`` in one
        atomic statement: concurrent workers' additions all count. Default: ``INSERT … ON
        CONFLICT DO UPDATE`` (PostgreSQL, SQLite 3.24+)."""
        self._insert_queue_counts(minute, counts, lambda q, table: (
            f"ON CONFLICT ({q('minute')}, {q('queue')}) DO UPDATE SET "
            f"{q('done')} = {table}.{q('done')} + excluded.{q('done')}, "
            f"{q('failed')} = {table}.{q('failed')} + excluded.{q('failed')}"))

    def _insert_queue_counts(self, minute: datetime.datetime,
                             counts: Sequence[tuple[str, int, int]],
                             on_conflict: Callable[[Callable[[str], str], str], str]) -> None:
        """``INSERT`` the counts' rows, ``on_conflict(quote_name, table)`` adding to a row
        that is there (the vendor's upsert clause)."""
        from django_jobguard.models import QueueMinute

        connection = connections[self.using]
        q = connection.ops.quote_name
        table = q(QueueMinute._meta.db_table)
        stamp = QueueMinute._meta.get_field("minute").get_db_prep_value(minute, connection)
        params: list[Any] = []
        for queue, done, failed in counts:
            params += [stamp, queue, done, failed]
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({q('minute')}, {q('queue')}, {q('done')}, {q('failed')}) "
                f"VALUES {', '.join(['(%s, %s, %s, %s)'] * len(counts))} "
                f"{on_conflict(q, table)}", params)

    def add_run_statistics(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Add ``RunStatistic`` rows (``models.STATISTIC_COLUMNS`` tuples, in key order) in
        one atomic statement: counts added, smallest and largest values kept. Default:
        ``INSERT … ON CONFLICT DO UPDATE`` (PostgreSQL, SQLite 3.24+)."""
        self._insert_run_statistics(rows, lambda q, table, merge: (
            f"ON CONFLICT ({', '.join(q(c) for c in STATISTIC_KEY)}) DO UPDATE SET " + ", ".join(
                merge(f"{table}.{q(c)}", f"excluded.{q(c)}", c) for c in STATISTIC_MERGED)))

    def _insert_run_statistics(self, rows: Sequence[tuple[Any, ...]], on_conflict: Any) -> None:
        """``INSERT`` the rows, ``on_conflict(quote_name, table, merge)`` merging into a row
        that is there; ``merge(old, new, column)`` is the SQL of a column's merged value."""
        from django_jobguard.models import STATISTIC_COLUMNS, RunStatistic

        connection = connections[self.using]
        q = connection.ops.quote_name
        table = q(RunStatistic._meta.db_table)
        period = RunStatistic._meta.get_field("period")

        def merge(old: str, new: str, column: str) -> str:
            if column in ("runs", "failures", "runtimes", "waits"):
                return f"{q(column)} = {old} + {new}"
            better = "<" if column.endswith("_min") else ">"
            return (f"{q(column)} = CASE WHEN {old} IS NULL OR {new} {better} {old} "
                    f"THEN {new} ELSE {old} END")

        at = STATISTIC_COLUMNS.index("period")
        for start in range(0, len(rows), 500):  # bounded statements (SQLite's variables)
            chunk = rows[start:start + 500]
            params: list[Any] = []
            for row in chunk:
                values = list(row)
                values[at] = period.get_db_prep_value(values[at], connection)
                params += values
            placeholders = "(" + ", ".join(["%s"] * len(STATISTIC_COLUMNS)) + ")"
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {table} ({', '.join(q(c) for c in STATISTIC_COLUMNS)}) "
                    f"VALUES {', '.join([placeholders] * len(chunk))} "
                    f"{on_conflict(q, table, merge)}", params)

    def queue_names(self) -> list[str]:
        """The queues that have rows, in order: a skip scan of the claim index (a recursive
        CTE, one index descent per queue) instead of a DISTINCT over every row."""
        connection = connections[self.using]
        table = connection.ops.quote_name(QueuedJob._meta.db_table)
        queue = connection.ops.quote_name("queue")
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH RECURSIVE names(name) AS (SELECT MIN({queue}) FROM {table} UNION ALL "
                f"SELECT (SELECT MIN({queue}) FROM {table} WHERE {queue} > names.name) "
                f"FROM names WHERE names.name IS NOT NULL) "
                f"SELECT name FROM names WHERE name IS NOT NULL")
            return [row[0] for row in cursor.fetchall()]

    def estimate_rows(self, rows: Any) -> int | None:
        """The planner's estimate of how many rows the queryset ``rows`` has, where the
        database offers a cheap one (PostgreSQL); ``None``: count them."""
        return None

    # -- locks (stores/database.py) --------------------------------------------------------

    @abstractmethod
    def acquire_lock(self, key: str, owner: str, *, ttl: float | None,
                     job_id: str) -> int | None:
        """Take the lock ``key`` if it is free or expired: its new fencing token, or ``None``.

        Atomic against concurrent acquirers; inside a transaction it is part of it."""

    @abstractmethod
    def release_lock(self, key: str, owner: str) -> bool:
        """Free ``key`` if ``owner`` holds it (the row stays, so its token keeps counting)."""

    # -- throttle rows (stores/database.py) ------------------------------------------------

    @abstractmethod
    def lock_throttles(self, keys: Sequence[str], kind: str) -> dict[str, ThrottleRow]:
        """Lock the throttle rows of ``keys`` in key order until the transaction ends,
        creating missing ones (of ``kind``) first; ``{key: row}``."""

    @abstractmethod
    def peek_throttle(self, key: str) -> ThrottleRow | None:
        """The throttle row of ``key`` without locking it (``None`` if there is none)."""

    @abstractmethod
    def write_throttle(self, key: str, *, kind: str, hits: int, limit: int, state: str,
                       value: float, data: str, resets_at: datetime.datetime | None,
                       expires_at: datetime.datetime) -> None:
        """Store a rate window's or circuit's state; ``updated_at`` is the database clock."""


# The fair order of a queue's due rows, by a window function over all of them (SQLite and
# MariaDB/MySQL; PostgreSQL walks the keys instead, dialects/postgresql.py). ``rn`` numbers
# each key's rows in claim order; a key's turn ``(rn - 1 + used) / weight`` comes first, then
# where the key stands from the cursor (its own unfinished turn, keys after it, the others),
# then the key. A per-key cap leaves out the rows beyond the key's budget: the cap less its
# reserved rows with a live lease.
_FAIR_RANKING = """
    SELECT r.id FROM (
        SELECT t.{id} AS id, t.{key} AS k, ROW_NUMBER() OVER (
                   PARTITION BY t.{key} ORDER BY t.{priority} DESC, t.{available_at}) AS rn
          FROM {table} t
         WHERE t.{queue} = %s AND t.{available_at} <= {now}
           AND NOT EXISTS (SELECT 1 FROM {paused} p WHERE p.{queue} = %s)) r{capped}
     ORDER BY (r.rn - 1 + CASE WHEN r.k = %s THEN %s ELSE 0 END) {div} {weight},
              CASE WHEN r.k = %s AND %s > 0 THEN 0 WHEN r.k > %s THEN 1 ELSE 2 END, r.k, r.rn
     LIMIT %s"""

_FAIR_CAPPED = """
      LEFT JOIN (SELECT {key} AS k, COUNT(*) AS n FROM {table}
                  WHERE {queue} = %s AND {reserved_at} IS NOT NULL AND {available_at} > {now}
                  GROUP BY {key}) c ON c.k = r.k
     WHERE r.rn <= %s - COALESCE(c.n, 0)"""


def fair_ranking(connection: Any, queue: str, fair: FairClaim, limit: int, *, now: str,
                 div: str = "/") -> tuple[str, list[Any]]:
    """The SELECT of the ids of the first ``limit`` due rows of ``queue`` in the fair order,
    and its parameters (``now``: the dialect's clock SQL; ``div``: integer division)."""
    q = connection.ops.quote_name
    meta = QueuedJob._meta
    names = {name: q(meta.get_field(name).column) for name in (
        "queue", "priority", "available_at", "reserved_at")}
    names.update(id=q(meta.pk.column), key=q(meta.get_field("fair_key").column),
                 table=q(meta.db_table), paused=q(PausedQueue._meta.db_table), now=now)
    params: list[Any] = [queue, queue]
    capped = ""
    if fair.per_key is not None:
        capped = _FAIR_CAPPED.format(**names)
        params += [queue, fair.per_key]
    weights = sorted(fair.weights.items())
    weight = ("CASE r.k " + " ".join(["WHEN %s THEN %s"] * len(weights)) + " ELSE 1 END"
              if weights else "1")
    cursor = fair.cursor
    params += [cursor.key, cursor.used, *(v for pair in weights for v in pair),
               cursor.key, cursor.used, cursor.key, limit]
    sql = _FAIR_RANKING.format(**names, capped=capped, div=div, weight=weight)
    return sql, params


def load_payload(text: Any) -> Any:
    """Decode a claimed payload. One that does not decode (corrupt, or nested too deep for
    the decoder) is kept as text, so the worker fails the job with a reason instead of the
    claim raising after it leased the rows."""
    try:
        return json.loads(text)
    except RecursionError:
        reason = "is nested too deeply for Python's JSON decoder"
    except ValueError as exc:
        reason = f"is not valid JSON ({exc})"
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8", "replace")
    return UndecodedPayload(str(text), reason)


#: The counters a claim or a start adds to: a row that reached :data:`COUNTER_MAX` in any of
#: them is quarantined (claims saturate there instead of overflowing the column).
COUNTERS = ("attempts", "exceptions", "claims")
_COUNTER_INDEXES = [(name, [f.name for f in QueuedJob._meta.concrete_fields].index(name))
                    for name in COUNTERS]


def claimed_rows(using: str, fetched: Iterable[Sequence[Any]]) -> list[QueuedJob]:
    """Claimed rows from the values of a raw statement (every concrete column in field order),
    converted as the ORM converts what it reads (e.g. SQLite's text to datetimes and UUIDs),
    all but the payload, which :func:`job_from_values` decodes itself.

    A value the conversion refuses (SQLite's ``'infinity'`` or year 10000 in a date column, a
    MySQL zero date in a NOT NULL one) is left ``None`` and named in the row's
    :attr:`poison`, so that one bad row is quarantined instead of failing the whole claim."""
    fetched = list(fetched)
    if not fetched:
        return []
    connection = connections[using]
    meta = QueuedJob._meta
    converters = []
    for index, model_field in enumerate(meta.concrete_fields):
        if index == PAYLOAD_INDEX:
            continue
        column = model_field.get_col(meta.db_table)
        functions = [*connection.ops.get_db_converters(column),
                     *column.get_db_converters(connection)]
        if functions:
            converters.append((index, model_field, column, functions))
    rows = []
    plain = plain_rows()
    for values in fetched:
        values = list(values)
        problems = []
        for index, model_field, column, functions in converters:
            raw = values[index]
            try:
                for convert in functions:
                    values[index] = convert(values[index], column, connection)
            except Exception as exc:  # whatever a converter raises, the row is poison
                values[index] = None
                problems.append(unloadable(model_field.name, raw, exc))
            else:
                if values[index] is None and not model_field.null:  # a MySQL zero date
                    problems.append(unloadable(model_field.name, raw))
        rows.append(job_from_values(using, values, problems, plain=plain))
    return rows


#: The claimed row's attribute names, in the concrete field order its values come in.
_ATTNAMES = tuple(f.attname for f in QueuedJob._meta.concrete_fields)


def plain_rows() -> bool:
    """Whether claimed rows may be built without ``Model.__init__`` (no ``post_init``
    receiver listens for :class:`QueuedJob`): asked once per claim, not per row."""
    return not post_init.has_listeners(QueuedJob)


def _from_db(using: str, values: list[Any], plain: bool | None = None) -> QueuedJob:
    """``QueuedJob.from_db(using, None, values)`` without ``Model.__init__``'s walk over the
    fields (a claimed row is built once per job): the same instance, attributes and state,
    while no ``post_init`` receiver listens for the model (else the ORM's own way; ``plain``:
    :func:`plain_rows`, when the caller asked it for a whole claim)."""
    if not (plain_rows() if plain is None else plain):
        return QueuedJob.from_db(using, None, values)
    row = QueuedJob.__new__(QueuedJob)
    row.__dict__.update(zip(_ATTNAMES, values, strict=True))
    state = row._state = ModelState()
    state.adding, state.db = False, using
    return row


def unloadable(column: str, raw: Any, error: BaseException | None = None) -> str:
    """The poison reason of a column value the driver or Django cannot load (``raw`` as the
    driver returned it: ``None`` for a NOT NULL column is a value it could not read)."""
    if raw is None:
        return (f"{column} cannot be loaded (the database driver read NULL from a NOT NULL "
                f"column: a zero date?)")
    shown = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    because = f" ({type(error).__name__}: {error})" if error is not None else ""
    return f"{column} {shown[:60]!r} cannot be loaded{because}"


def job_from_values(using: str, values: list[Any], problems: Sequence[str] = (), *,
                    plain: bool | None = None) -> QueuedJob:
    """A claimed :class:`QueuedJob` from its column values (in concrete field order, payload
    as stored text); ``payload_text_length`` tells the worker how long that text was.

    ``poison`` (set only on a poison row) says why the row cannot be run: ``problems`` the
    dialect found loading it, or a counter at :data:`COUNTER_MAX`. The worker quarantines it
    (fails it with that reason) instead of running it. ``plain``: :func:`plain_rows`, asked
    once for the rows of a claim."""
    text = values[PAYLOAD_INDEX]
    if isinstance(text, (str, bytes)):
        values[PAYLOAD_INDEX] = load_payload(text)
    checkpoint = values[CHECKPOINT_INDEX]
    if isinstance(checkpoint, (str, bytes)):  # JSON as the driver returns it: decoded here
        try:
            values[CHECKPOINT_INDEX] = json.loads(checkpoint)
        except ValueError:
            problems = [*problems, "its iterable job's checkpoint is not JSON"]
    for name, index in _COUNTER_INDEXES:
        if values[index] is not None and values[index] >= COUNTER_MAX:
            problems = [*problems, f"{name} reached the counter maximum ({COUNTER_MAX})"]
    row = _from_db(using, values, plain)
    row.payload_text_length = len(text) if isinstance(text, str) else None
    if problems:
        row.poison = "; ".join(problems)
    return row
