"""Locks and counters in the database (the default store; works on SQLite too).

Acquire is one ``INSERT … ON CONFLICT (key) DO UPDATE … WHERE free RETURNING token`` on
PostgreSQL and SQLite: atomic without a check-then-insert race, and one round trip. Other
databases (MySQL) use a conditional UPDATE, then an INSERT that the unique index on ``key``
makes atomic. Release and extend are single conditional UPDATEs. Every time comes from the
database clock, never the calling process's.

A released lock keeps its row (``owner`` empty) so the fencing token goes on counting up;
tokens also never go below the database time in microseconds, so they keep increasing after
:meth:`DatabaseStore.clean_expired` removed an old row.

Called inside a transaction on the store's database, an acquire is part of that transaction:
a rollback takes the lock back with everything else (dispatch relies on this).
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import BigIntegerField, F, Func, Q, Value
from django.db.models.functions import Greatest, Now

from django_jobguard.models import Lock
from django_jobguard.stores.base import LockInfo, Store, check_key, check_owner, check_ttl

# The database clock in microseconds since the epoch, per vendor.
_NOW_US = {
    "postgresql": "(EXTRACT(EPOCH FROM STATEMENT_TIMESTAMP()) * 1000000)::bigint",
    "sqlite": "(CAST(STRFTIME('%%s', 'now') AS INTEGER) * 1000000"
              " + CAST(SUBSTR(STRFTIME('%%f', 'now'), 4) AS INTEGER) * 1000)",
    "mysql": "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)",
}
_NOW = {
    "postgresql": "STATEMENT_TIMESTAMP()",
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now')",
}
_IN_SECONDS = {
    "postgresql": "STATEMENT_TIMESTAMP() + MAKE_INTERVAL(secs => %s)",
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %s || ' seconds')",
}
_GREATEST = {"postgresql": "GREATEST", "sqlite": "MAX"}

_RELEASE = "UPDATE {table} SET {owner} = '', {expires_at} = NULL WHERE {key} = %s AND {owner} = %s"

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


class _NowMicros(Func):
    """The database clock in microseconds (the token floor on the generic path)."""

    output_field = BigIntegerField()

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list]:
        sql = _NOW_US.get(connection.vendor)
        if sql is None:  # unknown backend: the best we have is this process's clock
            import time

            return "%s", [time.time_ns() // 1000]
        return sql, []


def _expiry(ttl: float | None) -> Any:
    return Now() + Value(datetime.timedelta(seconds=ttl)) if ttl else None


class DatabaseStore(Store):
    """Store backed by the ``Lock`` and ``Throttle`` tables on ``database`` (default alias)."""

    def __init__(self, *, alias: str, database: str = DEFAULT_DB_ALIAS) -> None:
        super().__init__(alias=alias)
        self.using = database
        self._upsert_sql: dict[tuple[str, bool | None], str] = {}

    def _locks(self):
        return Lock.objects.using(self.using)

    def _free(self):
        return Q(owner="") | Q(expires_at__lte=Now())

    # -- locks -----------------------------------------------------------------------------

    def acquire(self, key: str, owner: str, *, ttl: float | None = None,
                job_id: str = "") -> int | None:
        check_key(key)
        check_owner(owner)
        ttl = check_ttl(ttl)
        connection = connections[self.using]
        if connection.vendor in _UPSERT_VENDORS:
            sql = self._sql(connection, bool(ttl))
            params = [key, owner, *([ttl] if ttl else []), job_id[:64]]
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
            return int(row[0]) if row else None
        return self._acquire_generic(key, owner, ttl, job_id[:64])

    def _sql(self, connection: Any, with_ttl: bool | None) -> str:
        """The upsert (``with_ttl`` True/False) or the release (``None``) for this vendor."""
        cached = self._upsert_sql.get((connection.vendor, with_ttl))
        if cached is None:
            vendor, quote, meta = connection.vendor, connection.ops.quote_name, Lock._meta
            columns = {f.name: quote(f.column) for f in meta.concrete_fields}
            if with_ttl is None:
                cached = _RELEASE.format(table=quote(meta.db_table), **columns)
            else:
                cached = _UPSERT.format(
                    table=quote(meta.db_table), now_us=_NOW_US[vendor], now=_NOW[vendor],
                    expiry=_IN_SECONDS[vendor] if with_ttl else "NULL",
                    greatest=_GREATEST[vendor], **columns,
                )
            self._upsert_sql[(vendor, with_ttl)] = cached
        return cached

    def _acquire_generic(self, key: str, owner: str, ttl: float | None,
                         job_id: str) -> int | None:
        with transaction.atomic(using=self.using):
            taken = self._locks().filter(self._free(), key=key).update(
                owner=owner, token=Greatest(F("token") + 1, _NowMicros()),
                acquired_at=Now(), expires_at=_expiry(ttl), job_id=job_id,
            )
            if not taken:
                try:
                    with transaction.atomic(using=self.using):
                        self._locks().create(key=key, owner=owner, token=_NowMicros(),
                                             acquired_at=Now(), expires_at=_expiry(ttl),
                                             job_id=job_id)
                except IntegrityError:
                    return None
            return self._locks().filter(key=key, owner=owner).values_list(
                "token", flat=True).get()

    def release(self, key: str, owner: str) -> bool:
        connection = connections[self.using]
        if connection.vendor not in _UPSERT_VENDORS:
            return bool(self._locks().filter(key=key, owner=owner).update(owner="",
                                                                           expires_at=None))
        with connection.cursor() as cursor:  # the hot path: skip the ORM's compile step
            cursor.execute(self._sql(connection, None), [key, owner])
            return cursor.rowcount > 0

    def extend(self, key: str, owner: str, *, ttl: float) -> bool:
        ttl = check_ttl(ttl)
        held = Q(expires_at__isnull=True) | Q(expires_at__gt=Now())
        return bool(self._locks().filter(held, key=key, owner=owner).update(
            expires_at=_expiry(ttl)))

    def force_release(self, key: str) -> bool:
        return bool(self._locks().filter(key=key).exclude(owner="").update(owner="",
                                                                           expires_at=None))

    def _held(self):
        return self._locks().exclude(owner="").filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=Now())
        )

    def _info(self, row: Lock) -> LockInfo:
        return LockInfo(key=row.key, owner=row.owner, token=row.token,
                        acquired_at=row.acquired_at, expires_at=row.expires_at,
                        job_id=row.job_id, store=self.alias)

    def get_lock(self, key: str) -> LockInfo | None:
        row = self._held().filter(key=key).first()
        return self._info(row) if row else None

    def locks(self, prefix: str = "jobguard:", *, include_expired: bool = False) -> list[LockInfo]:
        qs = self._locks().exclude(owner="") if include_expired else self._held()
        return [self._info(row) for row in qs.filter(key__startswith=prefix).order_by("key")]

    def clean_expired(self) -> int:
        """Free expired locks (returns how many), and delete rows free for an hour.

        Freed rows stay for that hour so their key's token keeps counting from the row; after
        it, the clock floor alone is far above any token the deleted row had.
        """
        expired = self._locks().exclude(owner="").filter(expires_at__lte=Now()).update(
            owner="", expires_at=None)
        old = Now() - Value(datetime.timedelta(hours=1))
        self._locks().filter(owner="", acquired_at__lte=old)._raw_delete(self.using)
        return expired

    def now(self) -> datetime.datetime:
        connection = connections[self.using]
        sql = {
            "postgresql": "SELECT statement_timestamp()",
            "sqlite": "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')",
        }.get(connection.vendor, "SELECT UTC_TIMESTAMP(6)")
        with connection.cursor() as cursor:
            cursor.execute(sql)
            value = cursor.fetchone()[0]
        if isinstance(value, str):
            value = datetime.datetime.fromisoformat(value)
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return value


_UPSERT_VENDORS = set(_IN_SECONDS)
