"""The raw-SQL store primitives PostgreSQL and SQLite share: they both speak
``INSERT … ON CONFLICT … RETURNING``, so a lock is taken in one atomic round trip with no
check-then-insert race, and the throttle rows are read and written without the ORM's compile
step (these run once per guarded job). A dialect fills in its clock and interval SQL.

Statements are built on first use (quoting needs a connection) and cached as text.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connections

from django_jobguard import clock
from django_jobguard.dialects.base import Dialect, ThrottleRow, clock_value
from django_jobguard.models import Lock, Throttle

_RELEASE = "UPDATE {table} SET {owner} = '', {expires_at} = NULL WHERE {key} = %s AND {owner} = %s"

# The token is one more than the row's, and never below the clock in microseconds, so it
# keeps increasing after clean_expired() deleted an old row.
_UPSERT = """
INSERT INTO {table} ({key}, {owner}, {token}, {acquired_at}, {expires_at}, {job_id})
VALUES (%s, %s, {now_us}, {now}, {expiry}, %s)
ON CONFLICT ({key}) DO UPDATE
   SET {owner} = excluded.{owner},
       {token} = {greatest}({table}.{token} + 1, excluded.{token}),
       {acquired_at} = excluded.{acquired_at},
       {expires_at} = excluded.{expires_at},
       {job_id} = excluded.{job_id}
 WHERE {table}.{owner} = '' OR {table}.{expires_at} <= {now}
RETURNING {token}"""


_COUNT_SUCCESS = """UPDATE {table} SET {pending} = {pending} - 1
 WHERE {id} = %s AND {pending} > 0 RETURNING {pending}, {failed}"""


class SQLDialect(Dialect):
    """Locks and throttle rows in raw SQL; subclasses give the clock and interval SQL.

    The SQL fragments are written for Django's cursors (``%s`` parameters, ``%%`` for ``%``).
    """

    #: The database clock as a timestamp.
    NOW: str
    #: The database clock in microseconds since the epoch (a bigint).
    NOW_US: str
    #: The database clock plus ``%s`` seconds.
    IN_SECONDS: str
    #: The larger of two values.
    GREATEST: str
    #: Appended to a SELECT to lock its rows until the transaction ends.
    ROW_LOCK = " FOR UPDATE"
    #: INSERT missing throttle rows before the locking SELECT: on SQLite that takes the
    #: write lock at once (there is no FOR UPDATE), even without IMMEDIATE transactions.
    INSERT_THROTTLES_FIRST = False

    def __init__(self, using: str) -> None:
        super().__init__(using)
        shift = clock.offset()
        if shift:  # a test clock: every statement built below reads the shifted clock
            self.NOW, self.NOW_US, self.IN_SECONDS = self.shifted_clock(shift)
        self._lock_sql: dict[bool | None, str] = {}
        self._throttle_sql: dict[str, str] = {}
        self._lock_throttles_sql: dict[int, str] = {}
        self._batch_sql: str | None = None
        self._now_sql = f"SELECT {self.NOW}".replace("%%", "%")

    # -- clock -----------------------------------------------------------------------------

    def shifted_clock(self, seconds: float) -> tuple[str, str, str]:
        """``NOW``, ``NOW_US`` and ``IN_SECONDS`` ``seconds`` ahead of the database clock
        (the test clock, :mod:`django_jobguard.clock`)."""
        raise NotImplementedError

    def now(self) -> datetime.datetime:
        with connections[self.using].cursor() as cursor:
            # Without parameters, so nothing parses the statement for placeholders ("%%" is
            # "%" then): it runs for every rate-limit hit.
            cursor.execute(self._now_sql)
            value = cursor.fetchone()[0]
        return clock_value(value)

    # -- locks -----------------------------------------------------------------------------

    def acquire_lock(self, key: str, owner: str, *, ttl: float | None,
                     job_id: str) -> int | None:
        sql = self._lock_sql.get(bool(ttl)) or self._lock_statement(bool(ttl))
        params = [key, owner, ttl, job_id] if ttl else [key, owner, job_id]
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return int(row[0]) if row else None

    def release_lock(self, key: str, owner: str) -> bool:
        sql = self._lock_sql.get(None) or self._lock_statement(None)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, [key, owner])
            return cursor.rowcount > 0

    def _lock_statement(self, with_ttl: bool | None) -> str:
        """The upsert (``with_ttl`` True/False) or the release (``None``)."""
        quote, meta = connections[self.using].ops.quote_name, Lock._meta
        columns = {f.name: quote(f.column) for f in meta.concrete_fields}
        if with_ttl is None:
            sql = _RELEASE.format(table=quote(meta.db_table), **columns)
        else:
            sql = _UPSERT.format(table=quote(meta.db_table), now_us=self.NOW_US, now=self.NOW,
                                 expiry=self.IN_SECONDS if with_ttl else "NULL",
                                 greatest=self.GREATEST, **columns)
        self._lock_sql[with_ttl] = sql
        return sql

    # -- batches ---------------------------------------------------------------------------

    def count_batch_success(self, batch_id: Any) -> tuple[int, int] | None:
        """One UPDATE … RETURNING (once per batch member, so worth its raw SQL)."""
        from django_jobguard.models import Batch

        if self._batch_sql is None:
            quote, meta = connections[self.using].ops.quote_name, Batch._meta
            self._batch_sql = _COUNT_SUCCESS.format(
                table=quote(meta.db_table), id=quote(meta.pk.column),
                pending=quote(meta.get_field("pending_jobs").column),
                failed=quote(meta.get_field("failed_jobs").column))
        connection = connections[self.using]
        value = Batch._meta.pk.get_db_prep_value(uuid.UUID(str(batch_id)), connection)
        with connection.cursor() as cursor:
            cursor.execute(self._batch_sql, [value])
            found = cursor.fetchone()
        if found is None:  # no such batch, or nothing pending: read what it has
            return super().count_batch_success(batch_id)
        return found[0], found[1]

    # -- throttle rows ---------------------------------------------------------------------

    def lock_throttles(self, keys: Sequence[str], kind: str) -> dict[str, ThrottleRow]:
        sql = self._throttle_sql or self._throttle_statements()
        select = self._lock_throttles_sql.get(len(keys))
        if select is None:  # 1-3 keys in practice: one statement per count
            select = sql["lock"].format(keys=", ".join(["%s"] * len(keys)))
            self._lock_throttles_sql[len(keys)] = select
        with connections[self.using].cursor() as cursor:
            if not self.INSERT_THROTTLES_FIRST:
                cursor.execute(select, keys)
                rows = {r[0]: ThrottleRow(*r) for r in cursor.fetchall()}
                if len(rows) == len(keys):
                    return rows
            for key in keys:
                cursor.execute(sql["insert"], [key, kind])
            cursor.execute(select, keys)
            return {r[0]: ThrottleRow(*r) for r in cursor.fetchall()}

    def peek_throttle(self, key: str) -> ThrottleRow | None:
        sql = self._throttle_sql or self._throttle_statements()
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql["peek"], [key])
            found = cursor.fetchone()
        return ThrottleRow(*found) if found else None

    def write_throttle(self, key: str, *, kind: str, hits: int, limit: int, state: str,
                       value: float, data: str, resets_at: datetime.datetime | None,
                       expires_at: datetime.datetime) -> None:
        sql = self._throttle_sql or self._throttle_statements()
        connection = connections[self.using]
        adapt = connection.ops.adapt_datetimefield_value
        with connection.cursor() as cursor:
            cursor.execute(sql["write"], [kind, hits, limit, state, value, data,
                                          adapt(resets_at), adapt(expires_at), key])

    def _throttle_statements(self) -> dict[str, str]:
        """Peek, lock, insert and write statements on the throttle table."""
        quote, meta = connections[self.using].ops.quote_name, Throttle._meta
        c = {f.name: quote(f.column) for f in meta.concrete_fields}
        table = quote(meta.db_table)
        columns = f"{c['key']}, {c['data']}, {c['value']}, {c['state']}"
        self._throttle_sql.update({
            "peek": f"SELECT {columns} FROM {table} WHERE {c['key']} = %s",
            # {keys} is filled with one placeholder per key
            "lock": f"SELECT {columns} FROM {table} WHERE {c['key']} IN ({{keys}}) "
                    f"ORDER BY {c['key']}{self.ROW_LOCK}",
            "insert": f"INSERT INTO {table} ({c['key']}, {c['kind']}, {c['hits']}, "
                      f"{c['limit']}, {c['state']}, {c['value']}, {c['data']}) "
                      f"VALUES (%s, %s, 0, 0, '', 0, '') ON CONFLICT ({c['key']}) DO NOTHING",
            "write": f"UPDATE {table} SET {c['kind']} = %s, {c['hits']} = %s, "
                     f"{c['limit']} = %s, {c['state']} = %s, {c['value']} = %s, "
                     f"{c['data']} = %s, {c['resets_at']} = %s, {c['expires_at']} = %s, "
                     f"{c['updated_at']} = {self.NOW} WHERE {c['key']} = %s",
        })
        return self._throttle_sql
