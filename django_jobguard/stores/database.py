"""Locks and counters in the database (the default store; works on SQLite too).

Each primitive is one conditional UPDATE (atomic on every database), or an INSERT that the
unique index on ``key`` makes atomic. Expiry compares with the database's ``now()``.
"""

from __future__ import annotations

import datetime
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import (
    DEFAULT_DB_ALIAS,
    IntegrityError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import F, Q, Value
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
)


# Tokens never go below the current time in microseconds, so they keep increasing per key
# even after an old, free row was cleaned away.
def _token_floor() -> int:
    return time.time_ns() // 1000


def _expiry(ttl: float | None):
    return Now() + Value(datetime.timedelta(seconds=ttl)) if ttl else None


class DatabaseStore(Store):
    """Store backed by the ``Lock`` and ``Throttle`` tables on ``database`` (default alias)."""

    def __init__(self, *, alias: str, database: str = DEFAULT_DB_ALIAS) -> None:
        super().__init__(alias=alias)
        self.using = database

    def _locks(self):
        return Lock.objects.using(self.using)

    def _free(self):
        return Q(owner="") | Q(expires_at__lte=Now())

    def acquire(self, key: str, owner: str, *, ttl: float | None = None,
                job_id: str = "") -> int | None:
        floor = _token_floor()
        with transaction.atomic(using=self.using):
            taken = self._locks().filter(self._free(), key=key).update(
                owner=owner, token=Greatest(F("token") + 1, Value(floor)),
                acquired_at=Now(), expires_at=_expiry(ttl), job_id=job_id,
            )
            if taken:
                return self._locks().filter(key=key).values_list("token", flat=True).get()
            try:
                with transaction.atomic(using=self.using):
                    self._locks().create(key=key, owner=owner, token=floor, acquired_at=Now(),
                                         expires_at=_expiry(ttl), job_id=job_id)
            except IntegrityError:
                return None
            return floor

    def release(self, key: str, owner: str) -> bool:
        return bool(self._locks().filter(key=key, owner=owner).update(owner="", expires_at=None))

    def extend(self, key: str, owner: str, *, ttl: float) -> bool:
        return bool(self._locks().filter(key=key, owner=owner).update(expires_at=_expiry(ttl)))

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
        stale = Q(expires_at__lte=Now()) | Q(owner="", acquired_at__lte=Now() - Value(
            datetime.timedelta(hours=1)))
        qs = self._locks().filter(stale)
        return qs._raw_delete(self.using)

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

    def _locked(self, keys: list[str], kind: str) -> dict[str, Throttle]:
        def lock() -> dict[str, Throttle]:
            rows = self._throttles().select_for_update().filter(key__in=keys).order_by("key")
            return {row.key: row for row in rows}

        if connections[self.using].vendor != "sqlite":
            rows = lock()
            if len(rows) == len(keys):
                return rows
        self._throttles().bulk_create([Throttle(key=key, kind=kind) for key in keys],
                                      ignore_conflicts=True)
        return lock()

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
                    self._throttles().filter(key=key).update(
                        kind="rate", hits=sum(b[2] for b in log), limit=limit, state="",
                        value=decay / 1_000_000, data=counters.encode_log(log),
                        resets_at=_from_us(log[0][1] + decay),
                        expires_at=_from_us(log[-1][1] + decay), updated_at=Now())
            return outcome

        outcome = self._serialized(hit)
        return RateDecision(allowed=outcome.allowed, now=_from_us(outcome.now),
                            retry_after=outcome.wait / 1_000_000, blocked=outcome.blocked)

    def _circuit(self, row: Throttle | None, now: int) -> counters.Circuit:
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
        self._throttles().filter(key=key).update(
            kind="circuit", hits=c.failures, limit=max_attempts, state=c.state,
            value=decay / 1_000_000, data=counters.encode_circuit(c),
            resets_at=_from_us(c.until), expires_at=_from_us(expires), updated_at=Now())

    def circuit_enter(self, key: str, *, owner: str, max_attempts: int, decay: float,
                      probe_lease: float, _at: int | None = None) -> CircuitDecision:
        if _at is None:  # fast path: a closed circuit admits without a write
            row = self._throttles().filter(key=key).first()
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
            row = self._throttles().filter(key=key).first()
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
