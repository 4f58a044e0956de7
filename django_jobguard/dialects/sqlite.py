"""SQLite: claims and pushes in raw SQL, times as the ``STRFTIME`` text Django stores.

SQLite takes its write lock when a writing statement starts (or at ``BEGIN IMMEDIATE``), so
concurrent claims and lock upserts serialize: no SKIP LOCKED and no row locks are needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import DateTimeField, Field

from django_jobguard import clock
from django_jobguard.dialects.base import claimed_rows, fair_ranking
from django_jobguard.dialects.sql import SQLDialect
from django_jobguard.fair_share import FairClaim, fair_order
from django_jobguard.models import COUNTER_MAX, PausedQueue, QueuedJob

if TYPE_CHECKING:
    from django_jobguard.dialects.base import NewJob

_CLOCK = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now'{modifier})"

_PUSH_ROW = (f"(%s, %s, %s, %s, 0, 0, %s, COALESCE(%s, {_CLOCK.format(modifier=', %s')}), '', '',"
             f" %s)")
_PUSH_SQL = """INSERT INTO {table} (id, queue, name, payload, attempts, exceptions, priority,
                         available_at, reserved_by, last_error, fair_key)
VALUES {rows}"""
_PUSH_PARAMS_PER_ROW = _PUSH_ROW.count("%s")

# The lease a claim gives its rows (parameters: 1 or 0 added to attempts, the worker, the
# lease in seconds), followed by which rows.
_LEASE = """
    UPDATE {table}
       SET attempts = CASE WHEN attempts < {max} THEN attempts + %s ELSE attempts END,
           reserved_at = {now}, reserved_by = %s,
           claims = CASE WHEN claims < {max} THEN claims + 1 ELSE claims END,
           available_at = {in_seconds}"""

_CLAIM_SQL = _LEASE + """
     WHERE id IN (SELECT id FROM {table}
                   WHERE queue = %s AND available_at <= {now}
                     AND NOT EXISTS (SELECT 1 FROM {paused} WHERE queue = %s)
                   ORDER BY priority DESC, available_at
                   LIMIT %s)
    RETURNING {columns}"""

# A fair queue's claim: the same lease, of the rows the fair ranking picks
# (base.fair_ranking: one SELECT with a window function, inside this one writing statement).
_FAIR_CLAIM_SQL = _LEASE + """
     WHERE id IN ({ranking})
    RETURNING {columns}"""

_ACK_SQL = "DELETE FROM {table} WHERE id = %s AND reserved_by = %s AND claims = %s"


def _returned(field: Field) -> str:
    """A column as the claim returns it: a date as plain text, so that Django's converter
    in :func:`claimed_rows` parses it, where a value it cannot parse (``'infinity'``, year
    10000) makes one poison row (the column type's converter in the sqlite3 module would
    raise out of the fetch, after the claim leased every row)."""
    return f"CAST({field.column} AS TEXT)" if isinstance(field, DateTimeField) else field.column


def _decode(data: bytes, broken: set[str]) -> str:
    """A TEXT value as the claim reads it: UTF-8, else decoded with U+FFFD for the bytes that
    are not, and noted in ``broken``."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        text = data.decode("utf-8", "replace")
        broken.add(text)
        return text


class SQLiteDialect(SQLDialect):
    """SQLite 3.35+ (RETURNING)."""

    NOW = _CLOCK.format(modifier="")
    NOW_US = ("(CAST(STRFTIME('%%s', 'now') AS INTEGER) * 1000000"
              " + CAST(SUBSTR(STRFTIME('%%f', 'now'), 4) AS INTEGER) * 1000)")
    IN_SECONDS = _CLOCK.format(modifier=", '+' || %s || ' seconds'")
    GREATEST = "MAX"
    ROW_LOCK = ""
    INSERT_THROTTLES_FIRST = True

    def shifted_clock(self, seconds: float) -> tuple[str, str, str]:
        shift = f"'{float(seconds):+.6f} seconds'"
        return (_CLOCK.format(modifier=f", {shift}"),
                f"({self.NOW_US} + {round(seconds * 1_000_000)})",
                _CLOCK.format(modifier=f", {shift}, '+' || %s || ' seconds'"))

    def __init__(self, using: str) -> None:
        super().__init__(using)
        meta = QueuedJob._meta
        fields = meta.concrete_fields
        self._table = meta.db_table
        self._push_sql: dict[int, str] = {}
        shift = clock.offset()
        self._push_row = _PUSH_ROW if not shift else _PUSH_ROW.replace(
            _CLOCK.format(modifier=", %s"),
            _CLOCK.format(modifier=f", '{float(shift):+.6f} seconds', %s"))
        self._claim_sql = _CLAIM_SQL.format(table=meta.db_table, now=self.NOW,
                                            paused=PausedQueue._meta.db_table,
                                            in_seconds=self.IN_SECONDS, max=COUNTER_MAX,
                                            columns=", ".join(map(_returned, fields)))
        self._fair_claim_sql = _FAIR_CLAIM_SQL.format(
            table=meta.db_table, now=self.NOW, in_seconds=self.IN_SECONDS, max=COUNTER_MAX,
            columns=", ".join(map(_returned, fields)), ranking="{ranking}")
        self._ack_sql = _ACK_SQL.format(table=meta.db_table)

    # -- queue -----------------------------------------------------------------------------

    def push(self, jobs: Sequence[NewJob], *, batch_size: int) -> None:
        connection = connections[self.using]
        adapt = connection.ops.adapt_datetimefield_value
        per_statement = max(1, min(batch_size, (connection.features.max_query_params or 999)
                                   // _PUSH_PARAMS_PER_ROW))
        with connection.cursor() as cursor:
            for start in range(0, len(jobs), per_statement):
                batch = jobs[start:start + per_statement]
                params: list[Any] = []
                for job in batch:
                    # The delay as a STRFTIME modifier, written out here: SQLite reads neither
                    # '+-5 seconds' nor the exponent of a REAL ('1.0e-05').
                    params += [job.id.hex, job.queue, job.name, job.payload, job.priority,
                               adapt(job.at), f"{job.delay or 0:+.6f} seconds", job.fair_key]
                cursor.execute(self._push_statement(len(batch)), params)

    def _push_statement(self, rows: int) -> str:
        sql = self._push_sql.get(rows)
        if sql is None:
            sql = _PUSH_SQL.format(table=self._table, rows=", ".join([self._push_row] * rows))
            self._push_sql[rows] = sql
        return sql

    def claim(self, queue: str, *, worker_id: str, limit: int, lease: float,
              count_attempts: bool = True, fair: FairClaim | None = None) -> list[QueuedJob]:
        connection = connections[self.using]
        if fair is None:
            sql = self._claim_sql
            params = [int(count_attempts), worker_id, lease, queue, queue, limit]
        else:
            ranking, ranked = fair_ranking(connection, queue, fair, limit, now=self.NOW)
            sql = self._fair_claim_sql.replace("{ranking}", ranking)
            params = [int(count_attempts), worker_id, lease, *ranked]
        with connection.cursor() as cursor:
            # SQLite keeps whatever bytes were written as TEXT: one value that is not UTF-8
            # would make the fetch raise after the claim leased every row. Such a value is
            # read with U+FFFD for the bad bytes and its row is quarantined.
            raw, broken = connection.connection, set()
            default = raw.text_factory
            raw.text_factory = lambda data: _decode(data, broken)
            try:
                cursor.execute(sql, params)
                fetched = cursor.fetchall()
            finally:
                raw.text_factory = default
        rows = claimed_rows(self.using, fetched)
        if broken:
            names = [f.name for f in QueuedJob._meta.concrete_fields]
            for row, values in zip(rows, fetched, strict=True):
                bad = [f"{names[i]} {value[:60]!r} is not UTF-8 text"
                       for i, value in enumerate(values) if value in broken]
                if bad:
                    row.poison = "; ".join(filter(None, [getattr(row, "poison", ""), *bad]))
        return rows if fair is None else fair_order(rows, fair)

    def ack(self, job_id: Any, reserved_by: str, claims: int, *, relaxed: bool = False) -> bool:
        connection = connections[self.using]
        job_id = QueuedJob._meta.pk.get_db_prep_value(job_id, connection)
        with connection.cursor() as cursor:
            cursor.execute(self._ack_sql, [job_id, reserved_by, claims])
            return cursor.rowcount > 0

