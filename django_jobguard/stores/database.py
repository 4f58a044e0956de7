"""Locks and counters in the database (the default store; works on SQLite too).

Locks. Acquire is one ``INSERT … ON CONFLICT (key) DO UPDATE … WHERE free RETURNING token`` on
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
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import (
    DEFAULT_DB_ALIAS,
    IntegrityError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import BigIntegerField, F, Func, Q, Value
from django.db.models.functions import Greatest, Now

from django_jobguard.models import Lock, Throttle
from django_jobguard.stores import counters
from django_jobguard.stores.base import (
    CircuitDecision,
    LockInfo,
    RateDecision,
    RateWindow,
    Store,
    ThrottleInfo,
    check_key,
    check_owner,
    check_ttl,
)

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
        self._throttle_statements: dict[str, dict[str, str]] = {}

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

    # -- counters: rate-limit windows and exception circuits (see stores/counters.py) --------
    # Each write is one transaction: lock every row with SELECT ... FOR UPDATE in key order,
    # INSERTing the missing ones first (on SQLite always first, so that it takes its write lock
    # at once even without IMMEDIATE mode), read the database clock, apply the rules, write
    # back. A deadlock or "database is locked" retries the transaction (unless the caller's own
    # transaction surrounds it). Reads that change nothing skip the transaction.

    def _throttles(self):
        return Throttle.objects.using(self.using)

    def _now_us(self) -> int:
        return _to_us(self.now())

    def _locked(self, keys: list[str], kind: str) -> dict[str, Any]:
        """Lock the rows of ``keys`` (made first where missing) in key order; ``{key: row}``
        with the row's ``data``, ``value`` and ``state``."""
        connection = connections[self.using]
        if connection.vendor not in _UPSERT_VENDORS:
            return self._locked_generic(keys, kind)
        sql = self._throttle_sql(connection)
        with connection.cursor() as cursor:  # the hot path: no ORM compile, no model rows
            select = sql["lock"].format(keys=", ".join(["%s"] * len(keys)))
            if connection.vendor != "sqlite":
                cursor.execute(select, keys)
                rows = {r[0]: _ThrottleRow(*r) for r in cursor.fetchall()}
                if len(rows) == len(keys):
                    return rows
            for key in keys:
                cursor.execute(sql["insert"], [key, kind])
            cursor.execute(select, keys)
            return {r[0]: _ThrottleRow(*r) for r in cursor.fetchall()}

    def _peek(self, key: str) -> Any:
        """The row of ``key`` without locking it (``None`` if there is none)."""
        connection = connections[self.using]
        if connection.vendor not in _UPSERT_VENDORS:
            return self._throttles().filter(key=key).first()
        with connection.cursor() as cursor:
            cursor.execute(self._throttle_sql(connection)["peek"], [key])
            found = cursor.fetchone()
        return _ThrottleRow(*found) if found else None

    def _locked_generic(self, keys: list[str], kind: str) -> dict[str, Any]:
        def lock() -> dict[str, Throttle]:
            rows = self._throttles().select_for_update().filter(key__in=keys).order_by("key")
            return {row.key: row for row in rows}

        rows = lock()
        if len(rows) == len(keys):
            return rows
        self._throttles().bulk_create([Throttle(key=key, kind=kind) for key in keys],
                                      ignore_conflicts=True)
        return lock()

    def _throttle_sql(self, connection: Any) -> dict[str, str]:
        """Lock, insert and write statements on the throttle table for this vendor."""
        cached = self._throttle_statements.get(connection.vendor)
        if cached is None:
            quote, meta = connection.ops.quote_name, Throttle._meta
            c = {f.name: quote(f.column) for f in meta.concrete_fields}
            table = quote(meta.db_table)
            lock = " FOR UPDATE" if connection.vendor != "sqlite" else ""
            columns = f"{c['key']}, {c['data']}, {c['value']}, {c['state']}"
            cached = {
                "peek": f"SELECT {columns} FROM {table} WHERE {c['key']} = %s",
                # {keys} is filled with one placeholder per key (1-3 keys: not cached)
                "lock": f"SELECT {columns} FROM {table} WHERE {c['key']} IN ({{keys}}) "
                        f"ORDER BY {c['key']}{lock}",
                "insert": f"INSERT INTO {table} ({c['key']}, {c['kind']}, {c['hits']}, "
                          f"{c['limit']}, {c['state']}, {c['value']}, {c['data']}) "
                          f"VALUES (%s, %s, 0, 0, '', 0, '') ON CONFLICT ({c['key']}) "
                          f"DO NOTHING",
                "write": f"UPDATE {table} SET {c['kind']} = %s, {c['hits']} = %s, "
                         f"{c['limit']} = %s, {c['state']} = %s, {c['value']} = %s, "
                         f"{c['data']} = %s, {c['resets_at']} = %s, {c['expires_at']} = %s, "
                         f"{c['updated_at']} = {_NOW[connection.vendor]} "
                         f"WHERE {c['key']} = %s",
            }
            self._throttle_statements[connection.vendor] = cached
        return cached

    def _write(self, key: str, *, kind: str, hits: int, limit: int, state: str, value: float,
               data: str, resets_at: int | None, expires_at: int) -> None:
        """Store a window's or circuit's new state (times in µs of the store clock)."""
        connection = connections[self.using]
        resets = _from_us(resets_at) if resets_at else None
        expires = _from_us(expires_at)
        if connection.vendor not in _UPSERT_VENDORS:
            self._throttles().filter(key=key).update(
                kind=kind, hits=hits, limit=limit, state=state, value=value, data=data,
                resets_at=resets, expires_at=expires, updated_at=Now())
            return
        adapt = connection.ops.adapt_datetimefield_value
        with connection.cursor() as cursor:
            cursor.execute(self._throttle_sql(connection)["write"],
                           [kind, hits, limit, state, value, data, adapt(resets),
                            adapt(expires), key])

    def _serialized(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` in a transaction, retried on deadlocks and busy databases."""
        tries = 1 if connections[self.using].in_atomic_block else 4
        for attempt in range(1, tries + 1):
            try:
                with transaction.atomic(using=self.using):
                    return work()
            except OperationalError:
                if attempt == tries:
                    raise
                time.sleep(0.01 * attempt + random.random() * 0.02)
        raise AssertionError("unreachable")

    def hit_rate_limits(self, windows: Sequence[RateWindow], *,
                        _at: int | None = None) -> RateDecision:
        merged = counters.merge_windows(
            (w.key, w.limit, counters.us(w.decay)) for w in windows)
        keys = sorted(merged)

        def hit() -> counters.RateOutcome:
            rows = self._locked(keys, "rate")
            now = self._now_us() if _at is None else _at
            logs = {key: counters.decode_log(rows[key].data) for key in keys}
            outcome = counters.hit_windows(logs, merged, now)
            if outcome.allowed:
                for key in keys:
                    limit, decay = merged[key]
                    log = outcome.logs[key]
                    self._write(key, kind="rate", hits=sum(b[2] for b in log), limit=limit,
                                state="", value=decay / 1_000_000,
                                data=counters.encode_log(log), resets_at=log[0][1] + decay,
                                expires_at=log[-1][1] + decay)
            return outcome

        outcome = self._serialized(hit)
        return RateDecision(allowed=outcome.allowed, now=_from_us(outcome.now),
                            retry_after=outcome.wait / 1_000_000, blocked=outcome.blocked)

    def _circuit(self, row: Any, now: int) -> counters.Circuit:
        if row is None or not row.data:
            return counters.Circuit()
        return counters.load_circuit(counters.decode_circuit(row.data), now,
                                     counters.us(row.value))

    def _save_circuit(self, key: str, c: counters.Circuit, max_attempts: int,
                      decay: int) -> None:
        expires = counters.circuit_expiry(c, decay)
        if expires is None:
            self._throttles().filter(key=key).delete()
            return
        self._write(key, kind="circuit", hits=c.failures, limit=max_attempts, state=c.state,
                    value=decay / 1_000_000, data=counters.encode_circuit(c),
                    resets_at=c.until, expires_at=expires)

    def circuit_enter(self, key: str, *, owner: str, max_attempts: int, decay: float,
                      probe_lease: float, _at: int | None = None) -> CircuitDecision:
        if _at is None:  # fast path: a closed circuit admits without a write
            row = self._peek(key)
            if row is None:
                return _circuit_decision(key, counters.Entry(counters.Circuit(), True))
            if row.state == counters.CLOSED:
                now = self._now_us()
                c = self._circuit(row, now)
                if c.state == counters.CLOSED:
                    return _circuit_decision(key, counters.enter(c, now, owner=owner,
                                                                 probe_lease=0))
        def enter() -> counters.Entry:
            row = self._locked([key], "circuit")[key]
            now = self._now_us() if _at is None else _at
            entry = counters.enter(self._circuit(row, now), now, owner=owner,
                                   probe_lease=counters.us(probe_lease))
            if entry.changed:
                self._save_circuit(key, entry.circuit, max_attempts, counters.us(decay))
            elif entry.circuit.is_fresh:
                self._throttles().filter(key=key).delete()
            return entry

        return _circuit_decision(key, self._serialized(enter))

    def circuit_leave(self, key: str, *, owner: str, outcome: str, max_attempts: int,
                      decay: float, _at: int | None = None) -> CircuitDecision:
        if _at is None and outcome != counters.FAILURE:
            row = self._peek(key)
            if row is None:  # fast path: nothing to reset or hand back
                return _circuit_decision(key, counters.Entry(counters.Circuit(), True))
        def leave() -> counters.Circuit:
            row = self._locked([key], "circuit")[key]
            now = self._now_us() if _at is None else _at
            c = counters.leave(self._circuit(row, now), now, owner=owner, outcome=outcome,
                               max_attempts=max_attempts, decay=counters.us(decay))
            self._save_circuit(key, c, max_attempts, counters.us(decay))
            return c

        return _circuit_decision(key, counters.Entry(self._serialized(leave), True))

    def throttles(self, prefix: str = "jobguard:") -> list[ThrottleInfo]:
        now = self._now_us()
        out = []
        for row in self._throttles().filter(key__startswith=prefix).order_by("key"):
            if row.kind == "rate":
                decay = counters.us(row.value)
                seen = counters.describe_rate(counters.decode_log(row.data), now, decay)
                if seen is not None:
                    out.append(ThrottleInfo(key=row.key, kind="rate", hits=seen[0],
                                            limit=row.limit, resets_at=_from_us(seen[1]),
                                            store=self.alias))
            elif row.kind == "circuit":
                c = counters.describe_circuit(counters.decode_circuit(row.data), now,
                                              counters.us(row.value))
                if c is not None:
                    out.append(ThrottleInfo(key=row.key, kind="circuit", hits=c.failures,
                                            limit=row.limit, state=c.state,
                                            resets_at=_from_us(c.until), store=self.alias))
        return out

    def reset_throttle(self, key: str) -> bool:
        return bool(self._throttles().filter(key=key).delete()[0])

    def clean_expired_throttles(self) -> int:
        return self._throttles().filter(expires_at__lte=Now()).delete()[0]


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _to_us(value: datetime.datetime) -> int:
    return (value - _EPOCH) // datetime.timedelta(microseconds=1)


def _from_us(value: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(microseconds=value)


def _circuit_decision(key: str, entry: counters.Entry) -> CircuitDecision:
    c = entry.circuit
    return CircuitDecision(key=key, state=c.state, failures=c.failures, admitted=entry.admitted,
                           probe=entry.probe, retry_after=entry.wait / 1_000_000,
                           until=_from_us(c.until) if c.until else None)


_UPSERT_VENDORS = set(_IN_SECONDS)


@dataclass(frozen=True)
class _ThrottleRow:
    """What a locked throttle row holds for the counters (the raw-SQL path's row)."""

    key: str
    data: str
    value: float
    state: str
