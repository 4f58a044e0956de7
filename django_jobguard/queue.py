"""The ORM queue: push, claim, ack, release and fail rows of :class:`QueuedJob`.

All database dialect differences live here. Times that decide visibility come from the
database clock (``now()``), so app servers with skewed clocks agree on what is due.

A claimed row gets ``available_at = now + RETRY_AFTER`` (its lease) and the worker's id in
``reserved_by``. A worker that dies stops renewing the lease and the row becomes claimable
again, with its attempt counted. Every later write checks ``reserved_by`` so that a worker
which lost its lease cannot ack or release a job another worker now holds.
"""

from __future__ import annotations

import datetime
import json
import traceback as tb_module
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Count, F, Max, Min, Q, Value
from django.db.models.functions import Now

from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, JobResult, QueuedJob

NOTIFY_CHANNEL = "jobguard"


@dataclass
class NewJob:
    """A job about to be inserted (built by dispatch, inserted by :func:`push`)."""

    name: str
    queue: str
    payload: dict[str, Any]
    priority: int = 0
    delay: datetime.timedelta | datetime.datetime | None = None
    id: uuid.UUID = field(default_factory=uuid.uuid4)

    def to_model(self) -> QueuedJob:
        row = QueuedJob(id=self.id, name=self.name, queue=self.queue, payload=self.payload,
                        priority=self.priority)
        if isinstance(self.delay, datetime.datetime):
            row.available_at = self.delay
        elif self.delay:
            row.available_at = Now() + Value(self.delay)
        return row


def _vendor(using: str) -> str:
    return connections[using].vendor


# PostgreSQL: one statement per batch, whatever its size: the rows travel as seven arrays
# (no per-row SQL to compile or quote), delays are added to the database clock, and the
# NOTIFY rides along in the same round trip (delivered when the caller's transaction commits).
_PG_PUSH_SQL = """
    {notify_head}INSERT INTO {table} (id, queue, name, payload, attempts, exceptions, priority,
                             available_at, reserved_by, last_error)
    SELECT t.id, t.queue, t.name, t.payload::jsonb, 0, 0, t.priority,
           COALESCE(t.at, statement_timestamp() + make_interval(secs => COALESCE(t.delay, 0))),
           '', ''
      FROM unnest(%s::uuid[], %s::varchar[], %s::varchar[], %s::text[], %s::smallint[],
                  %s::timestamptz[], %s::float8[])
           AS t(id, queue, name, payload, priority, at, delay){notify_tail}"""
_PG_NOTIFY_HEAD = "WITH inserted AS ("
_PG_NOTIFY_TAIL = f"""
    RETURNING queue)
    SELECT pg_notify('{NOTIFY_CHANNEL}', q.queue) FROM (SELECT DISTINCT queue FROM inserted) q"""


# One job (a view's dispatch()): plain VALUES through a server-binding cursor, which psycopg
# can prepare; the batch statement's seven arrays cost more to quote than the row itself.
_PG_PUSH_ONE_SQL = """
    {notify_head}INSERT INTO {table} (id, queue, name, payload, attempts, exceptions, priority,
                             available_at, reserved_by, last_error)
    VALUES (%s, %s, %s, %s::jsonb, 0, 0, %s::smallint,
            COALESCE(%s::timestamptz,
                     statement_timestamp() + make_interval(secs => COALESCE(%s::float8, 0))),
            '', ''){notify_tail}"""


def _when(job: NewJob) -> tuple[datetime.datetime | None, float | None]:
    """``(available_at, delay_seconds)`` for the insert: at most one of them is set."""
    when = job.delay
    return (when if isinstance(when, datetime.datetime) else None,
            when.total_seconds() if isinstance(when, datetime.timedelta) else None)


def _push_postgresql(jobs: Sequence[NewJob], *, using: str, batch_size: int) -> None:
    wake = jobguard_settings.USE_NOTIFY
    parts = {"table": QueuedJob._meta.db_table, "notify_head": _PG_NOTIFY_HEAD if wake else "",
             "notify_tail": _PG_NOTIFY_TAIL if wake else ""}
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    if len(jobs) == 1:
        job = jobs[0]
        _hot_execute(using, _PG_PUSH_ONE_SQL.format(**parts), [
            job.id, job.queue, job.name, dumps(job.payload), job.priority, *_when(job)])
        return
    sql = _PG_PUSH_SQL.format(**parts)
    with connections[using].cursor() as cursor:
        for start in range(0, len(jobs), batch_size):
            batch = jobs[start:start + batch_size]
            at, delay = (list(column) for column in zip(*map(_when, batch), strict=True))
            cursor.execute(sql, [[job.id for job in batch], [job.queue for job in batch],
                                 [job.name for job in batch],
                                 [dumps(job.payload) for job in batch],
                                 [job.priority for job in batch], at, delay])


def push(jobs: Sequence[NewJob], *, using: str = DEFAULT_DB_ALIAS, batch_size: int = 500) -> None:
    """Insert ``jobs`` (one INSERT per batch) and wake PostgreSQL workers listening."""
    if not jobs:
        return
    if _vendor(using) == "postgresql":
        _push_postgresql(jobs, using=using, batch_size=max(batch_size, 1))
        return
    rows = [job.to_model() for job in jobs]
    if len(rows) == 1:
        rows[0].save(force_insert=True, using=using)
    else:
        QueuedJob.objects.using(using).bulk_create(rows, batch_size=batch_size)
    notify({job.queue for job in jobs}, using=using)


def notify(queues: Iterable[str], *, using: str = DEFAULT_DB_ALIAS) -> None:
    """PostgreSQL only: NOTIFY listeners (sent when the surrounding transaction commits)."""
    if _vendor(using) != "postgresql" or not jobguard_settings.USE_NOTIFY:
        return
    with connections[using].cursor() as cursor:
        for queue in sorted(queues):
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue])


# -- claiming ------------------------------------------------------------------------------

_CLAIM_SQL = {
    # One statement: pick due rows in order, skip rows another worker is taking, lease them.
    # The candidates are picked and locked ONCE, in a MATERIALIZED CTE. With the older
    # ``WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` a plan made while the table
    # looked empty (a cached generic plan, or statistics from autovacuum on a drained queue)
    # runs the subquery again for every row of the table: each run sorts the queue and locks
    # another row, so a burst of 20k jobs stalled 4 claimers for minutes (bench/throughput.py).
    "postgresql": """
        WITH picked AS MATERIALIZED (
            SELECT id FROM {table}
             WHERE queue = %(queue)s AND available_at <= statement_timestamp()
             ORDER BY priority DESC, available_at
             LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
        UPDATE {table} AS q SET attempts = q.attempts + 1, reserved_at = statement_timestamp(),
               reserved_by = %(worker)s,
               available_at = statement_timestamp() + make_interval(secs => %(lease)s)
          FROM picked WHERE q.id = picked.id
        RETURNING {columns}""",
    # SQLite takes the write lock when the UPDATE starts, so concurrent claims serialize.
    "sqlite": """
        UPDATE {table} SET attempts = attempts + 1,
               reserved_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), reserved_by = %s,
               available_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %s || ' seconds')
         WHERE id IN (SELECT id FROM {table}
                       WHERE queue = %s
                         AND available_at <= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
                       ORDER BY priority DESC, available_at
                       LIMIT %s)
        RETURNING {columns}""",
}


def claim(
    queues: Sequence[str],
    *,
    worker_id: str,
    limit: int = 1,
    using: str = DEFAULT_DB_ALIAS,
) -> list[QueuedJob]:
    """Reserve up to ``limit`` due jobs from the first of ``queues`` that has any."""
    lease = float(jobguard_settings.RETRY_AFTER)
    for queue in queues:
        rows = _claim_one_queue(queue, worker_id=worker_id, limit=limit, lease=lease, using=using)
        if rows:
            rows.sort(key=lambda r: (-r.priority, r.available_at))
            return rows
    return []


def _claim_one_queue(queue: str, *, worker_id: str, limit: int, lease: float,
                     using: str) -> list[QueuedJob]:
    vendor = _vendor(using)
    if vendor == "postgresql":
        return _claim_postgresql(queue, worker_id=worker_id, limit=limit, lease=lease,
                                 using=using)
    if vendor in _CLAIM_SQL:
        meta = QueuedJob._meta
        columns = ", ".join(f.column for f in meta.concrete_fields)
        sql = _CLAIM_SQL[vendor].format(table=meta.db_table, columns=columns)
        return list(QueuedJob.objects.using(using).raw(sql, [worker_id, lease, queue, limit]))
    # Generic path (MySQL/MariaDB): lock candidate rows, then lease them, in one transaction.
    with transaction.atomic(using=using):
        candidates = QueuedJob.objects.using(using).filter(
            queue=queue, available_at__lte=Now()
        ).order_by("-priority", "available_at")
        if connections[using].features.has_select_for_update_skip_locked:
            candidates = candidates.select_for_update(skip_locked=True)
        else:
            candidates = candidates.select_for_update()
        ids = list(candidates.values_list("id", flat=True)[:limit])
        if not ids:
            return []
        QueuedJob.objects.using(using).filter(id__in=ids).update(
            attempts=F("attempts") + 1,
            reserved_at=Now(),
            reserved_by=worker_id,
            available_at=Now() + Value(datetime.timedelta(seconds=lease)),
        )
        return list(QueuedJob.objects.using(using).filter(id__in=ids, reserved_by=worker_id))


def _claim_postgresql(queue: str, *, worker_id: str, limit: int, lease: float,
                      using: str) -> list[QueuedJob]:
    """The claim statement with rows built straight from the cursor (no RawQuerySet): this
    runs once per job or batch, and the ORM's per-query work was a third of a no-op job."""
    meta = QueuedJob._meta
    fields = meta.concrete_fields
    sql = _CLAIM_SQL["postgresql"].format(table=meta.db_table,
                                          columns=", ".join(f"q.{f.column}" for f in fields))
    payload_index = [f.name for f in fields].index("payload")
    # Never prepared: its best plan depends on how full the queue is, and a generic plan
    # cached while the queue was empty would seq-scan and sort a burst on every claim.
    fetched = _hot_execute(using, sql, {"queue": queue, "limit": limit, "worker": worker_id,
                                        "lease": lease}, fetch=True, prepare=False)
    rows = []
    for values in fetched:
        values = list(values)
        text = values[payload_index]
        if isinstance(text, str):  # Django loads jsonb as text
            values[payload_index] = _load_payload(text)
        row = QueuedJob.from_db(using, None, values)
        row.payload_text_length = len(text) if isinstance(text, str) else None
        rows.append(row)
    return rows


def _hot_execute(using: str, sql: str, params: Sequence[Any] | dict[str, Any], *,
                 fetch: bool = False, prepare: bool | None = None) -> Any:
    """Run a statement of the per-job path (claim, ack) on PostgreSQL.

    With psycopg 3 it goes through a server-binding cursor on Django's connection, so when
    the database ``OPTIONS`` set ``prepare_threshold`` (Django turns prepared statements off
    by default, for connection poolers) the statement is prepared once per connection instead
    of parsed and planned per job (``prepare=False`` opts a statement out). Errors still
    surface as Django's ``DatabaseError``. Returns the fetched rows, or the row count.
    """
    wrapper = connections[using]
    try:
        import psycopg
    except ImportError:
        psycopg = None
    if psycopg is None or wrapper.queries_logged:
        with wrapper.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if fetch else cursor.rowcount
    wrapper.ensure_connection()
    with wrapper.wrap_database_errors, psycopg.Cursor(wrapper.connection) as cursor:
        cursor.execute(sql, params, prepare=prepare)
        return cursor.fetchall() if fetch else cursor.rowcount


def _load_payload(text: str) -> Any:
    """Decode a payload; a corrupt one is kept as text so the worker can fail it with a
    reason instead of crashing on the claim."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def next_due(queues: Sequence[str], *, using: str = DEFAULT_DB_ALIAS) -> datetime.datetime | None:
    """When the earliest row of ``queues`` becomes claimable (``None`` if they are empty)."""
    return QueuedJob.objects.using(using).filter(queue__in=queues).aggregate(
        due=Min("available_at"))["due"]


def seconds_until_due(queues: Sequence[str], *, using: str = DEFAULT_DB_ALIAS) -> float | None:
    """Seconds until the earliest row of ``queues`` becomes claimable, measured with the
    database clock in the same query (``None`` if the queues are empty)."""
    found = QueuedJob.objects.using(using).filter(queue__in=queues).aggregate(
        due=Min("available_at"), now=Max(Now()))
    if found["due"] is None:
        return None
    return (found["due"] - found["now"]).total_seconds()


def extend_leases(worker_id: str, *, ids: Iterable[Any] | None = None,
                  using: str = DEFAULT_DB_ALIAS) -> int:
    """Push back the lease of the rows ``worker_id`` holds (the worker's heartbeat); only of
    ``ids`` among them when given (the jobs it is still working on)."""
    lease = datetime.timedelta(seconds=float(jobguard_settings.RETRY_AFTER))
    rows = QueuedJob.objects.using(using).filter(reserved_by=worker_id, reserved_at__isnull=False)
    if ids is not None:
        rows = rows.filter(id__in=list(ids))
    return rows.update(available_at=Now() + Value(lease))


# -- finishing -----------------------------------------------------------------------------


def _held(row: QueuedJob, using: str):
    return QueuedJob.objects.using(using).filter(id=row.id, reserved_by=row.reserved_by)


_PG_ACK_SQL = "DELETE FROM {table} WHERE id = %s AND reserved_by = %s"


def ack(row: QueuedJob, *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Delete a finished job; False if the worker no longer held it (lease lost)."""
    if _vendor(using) == "postgresql":  # hot path: skip building a QuerySet per job
        return _hot_execute(using, _PG_ACK_SQL.format(table=QueuedJob._meta.db_table),
                            [row.id, row.reserved_by]) > 0
    qs = _held(row, using)
    return bool(qs._raw_delete(using))


def release(
    row: QueuedJob,
    *,
    delay: float = 0,
    count_attempt: bool = True,
    exception: BaseException | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Make a reserved job available again after ``delay`` seconds.

    ``count_attempt=False`` gives back the attempt the claim took (a deferral).
    ``exception`` counts towards ``max_exceptions`` and is kept as the last error.
    """
    changes: dict[str, Any] = {
        "reserved_at": None,
        "reserved_by": "",
        "available_at": Now() + Value(datetime.timedelta(seconds=delay)) if delay > 0 else Now(),
    }
    if not count_attempt:
        changes["attempts"] = F("attempts") - 1
    if exception is not None:
        changes["exceptions"] = F("exceptions") + 1
        changes["last_error"] = describe(exception)
    return bool(_held(row, using).update(**changes))


def describe(exception: BaseException) -> str:
    return f"{type(exception).__module__}.{type(exception).__qualname__}: {exception}"[:2000]


def fail(
    row: QueuedJob,
    exception: BaseException,
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> FailedJob | None:
    """Move a job to failed jobs with its exception and traceback, in one transaction."""
    exc_type = type(exception)
    formatted = "".join(tb_module.format_exception(exc_type, exception, exception.__traceback__))
    with transaction.atomic(using=using):
        if not _held(row, using)._raw_delete(using):
            return None
        return FailedJob.objects.using(using).create(
            id=row.id,
            queue=row.queue,
            name=row.name,
            payload=row.payload,
            attempts=row.attempts,
            priority=row.priority,
            exception_class=f"{exc_type.__module__}.{exc_type.__qualname__}",
            message=str(exception)[:10_000],
            traceback=formatted[-50_000:],
            last_error=row.last_error,
        )


# -- operations ----------------------------------------------------------------------------


def retry_failed(failed: Iterable[FailedJob], *, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Queue failed jobs again with fresh attempts (and a recomputed ``retry_until``)."""
    from django_jobguard import registry
    from django_jobguard.exceptions import JobGuardError

    ids = []
    with transaction.atomic(using=using):
        for item in failed:
            payload = dict(item.payload)
            if "retry_until" in payload:
                try:
                    job = registry.get(item.name).from_payload(payload)
                    deadline = job.retry_until()
                    payload["retry_until"] = deadline.isoformat() if deadline else None
                except (LookupError, ValueError, TypeError, JobGuardError):
                    payload.pop("retry_until", None)
            QueuedJob.objects.using(using).create(
                id=item.id, name=item.name, queue=item.queue, payload=payload,
                priority=item.priority,
            )
            # A kept result (django.tasks) is waiting again.
            JobResult.objects.using(using).filter(id=item.id).update(status="READY",
                                                                     finished_at=None)
            ids.append(str(item.id))  # before delete(), which clears the pk
            item.delete()
        notify({item.queue for item in failed} if ids else (), using=using)
    return ids


def clear(queues: Sequence[str] | None = None, *, using: str = DEFAULT_DB_ALIAS,
          deleted_payloads: list[dict[str, Any]] | None = None) -> int:
    """Delete waiting and delayed jobs (reserved ones finish) from ``queues`` or all queues.

    With a ``deleted_payloads`` list, the payloads of exactly the deleted rows are appended to
    it (rows are locked first, so one a worker claims meanwhile is neither deleted nor listed).
    """
    qs = QueuedJob.objects.using(using).filter(Q(reserved_at__isnull=True) |
                                               Q(available_at__lte=Now()))
    if queues:
        qs = qs.filter(queue__in=queues)
    if deleted_payloads is None:
        return qs._raw_delete(using)
    skip_locked = connections[using].features.has_select_for_update_skip_locked
    with transaction.atomic(using=using):
        rows = list(qs.select_for_update(skip_locked=skip_locked).values_list("id", "payload"))
        for start in range(0, len(rows), 500):
            chunk = [row_id for row_id, _ in rows[start:start + 500]]
            QueuedJob.objects.using(using).filter(id__in=chunk)._raw_delete(using)
    deleted_payloads.extend(payload for _, payload in rows)
    return len(rows)


def stats(using: str = DEFAULT_DB_ALIAS) -> dict[str, dict[str, int]]:
    """Per queue: ``waiting``, ``delayed``, ``reserved`` and ``failed`` counts."""
    now = Now()
    out: dict[str, dict[str, int]] = {}
    rows = QueuedJob.objects.using(using).values("queue").annotate(
        reserved=Count("id", filter=Q(reserved_at__isnull=False, available_at__gt=now)),
        delayed=Count("id", filter=Q(reserved_at__isnull=True, available_at__gt=now)),
        waiting=Count("id", filter=Q(available_at__lte=now)),
    )
    for row in rows:
        out[row["queue"]] = {"waiting": row["waiting"], "delayed": row["delayed"],
                             "reserved": row["reserved"], "failed": 0}
    for row in FailedJob.objects.using(using).values("queue").annotate(n=Count("id")):
        out.setdefault(row["queue"], {"waiting": 0, "delayed": 0, "reserved": 0, "failed": 0})
        out[row["queue"]]["failed"] = row["n"]
    return out


class Listener:
    """PostgreSQL LISTEN on its own connection, so idle workers wake on NOTIFY at once."""

    def __init__(self, raw_connection: Any) -> None:
        self._conn = raw_connection

    @classmethod
    def open(cls, using: str = DEFAULT_DB_ALIAS) -> Listener | None:
        """A listener for ``using``, or ``None`` where NOTIFY is not available."""
        wrapper = connections[using]
        if wrapper.vendor != "postgresql":
            return None
        try:
            import psycopg
        except ImportError:  # psycopg2: poll at --sleep
            return None
        params = wrapper.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("prepare_threshold", None)
        params.pop("server_side_binding", None)
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return cls(conn)

    def wait(self, timeout: float) -> bool:
        """True when a notification arrived within ``timeout`` seconds."""
        woke = False
        for _ in self._conn.notifies(timeout=timeout, stop_after=1):
            woke = True
        if woke:  # drain the rest so the next wait blocks again
            for _ in self._conn.notifies(timeout=0):
                pass
        return woke

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:
            pass
