"""Locks and counters in the database (the default store; works on SQLite too).

Locks. Acquire is atomic without a check-then-insert race (the statements are the dialect's:
one upsert where the database has ``ON CONFLICT``, see :mod:`django_jobguard.dialects`).
Release and extend are single conditional UPDATEs. Every time comes from the database clock,
never the calling process's.

A released lock keeps its row (``owner`` empty) so the fencing token goes on counting up;
tokens also never go below the database time in microseconds, so they keep increasing after
:meth:`DatabaseStore.clean_expired` removed an old row.

Called inside a transaction on the store's database, an acquire is part of that transaction:
a rollback takes the lock back with everything else (dispatch relies on this).

When the database cannot be reached (down, restarting, a connection it cut, a lock wait that
kept timing out) every primitive raises
:class:`~django_jobguard.exceptions.StoreUnavailableError`, chained to the database error, as
the Redis store does, so that the worker can tell an outage from a job's own failure (see
:func:`_reachable`). A connection the error left broken is closed, outside a transaction, so
that the next call connects again.
"""

from __future__ import annotations

import datetime
import functools
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import Q, Value
from django.utils.functional import cached_property

from django_jobguard import clock
from django_jobguard.conf import queue_database
from django_jobguard.dialects import Dialect, ThrottleRow, dialect_for
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.models import Lock, Throttle
from django_jobguard.stores import counters
from django_jobguard.stores.base import (
    UNREADABLE,
    CircuitDecision,
    LockInfo,
    LockPage,
    RateDecision,
    RateWindow,
    Store,
    ThrottleInfo,
    check_key,
    check_owner,
    check_ttl,
)


def _reachable(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the database errors of a store that cannot be reached into
    :class:`StoreUnavailableError` (chained to them): an ``OperationalError`` or
    ``InterfaceError`` on a connection that could not be made or is broken (refused, lost or
    closed, a server shutting down), a busy database (a lock wait or a deadlock still failing
    after the store's own retries, where it retries), and any other database error raised on
    a connection that turns out to be broken (a driver may say so with another class).
    Outside a transaction a broken connection is closed first, so the next call connects
    again (Django only does that between requests, and a worker after a job).

    Errors the database answered with stay what they are: integrity and data errors, SQL
    errors (SQLite and MySQL report a missing table or column as ``OperationalError``: the
    connection still works, so it is not an outage), and a deadlock, a serialization failure
    or a lock wait that ran out inside the caller's own transaction (an atomic block, or
    autocommit turned off), which the caller has to roll back and try again (its ``except
    OperationalError`` still sees it)."""

    @functools.wraps(method)
    def call(self: DatabaseStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            connection = connections[self.using]
            conflict = _conflict(exc)
            if conflict and _in_transaction(connection):
                raise
            if not (conflict or connection.connection is None
                    or isinstance(exc, InterfaceError) or self._broken()):
                raise  # answered on a working connection: the statement's own error
            raise StoreUnavailableError(self.alias, exc) from exc
        except DatabaseError as exc:
            if isinstance(exc, (IntegrityError, DataError)) or not self._close_broken():
                raise
            raise StoreUnavailableError(self.alias, exc) from exc

    return call


def _in_transaction(connection: Any) -> bool:
    """Whether ``connection`` is inside its caller's transaction: an atomic block, or
    autocommit turned off (``transaction.set_autocommit(False)``)."""
    return connection.in_atomic_block or (connection.connection is not None
                                          and not connection.autocommit)


def _conflict(exc: Exception) -> bool:
    """Whether ``exc`` is a transaction losing a race rather than the database being out of
    reach: a deadlock or serialization failure (SQLSTATE class 40), a lock wait that ran out
    (PostgreSQL's ``lock_timeout``, 55P03, or ``statement_timeout``, 57014; MySQL's 1205),
    MySQL's deadlock (1213), SQLite's locked database."""
    cause = exc.__cause__
    state = str(getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None) or "")
    text = str(exc).lower()
    return (state.startswith("40") or state in ("55P03", "57014")
            or exc.args[:1] in ((1213,), (1205,))
            or "deadlock" in text or "database is locked" in text
            or "database table is locked" in text)


def _expiry(ttl: float | None) -> Any:
    return clock.db_now() + Value(datetime.timedelta(seconds=ttl)) if ttl else None


class DatabaseStore(Store):
    """Store backed by the ``Lock`` and ``Throttle`` tables on ``database`` (default: the
    queue's, ``JOBGUARD['DATABASE']``)."""

    def __init__(self, *, alias: str, database: str | None = None) -> None:
        super().__init__(alias=alias)
        self.using = queue_database(database)

    @cached_property
    def _dialect(self) -> Dialect:
        """The storage primitives of the store's database (looked up once: hot path)."""
        return dialect_for(self.using)

    def _locks(self):
        return Lock.objects.using(self.using)

    def _close_broken(self) -> bool:
        """Close the store's connection if an error left it open but unusable, and it is not
        inside a transaction (the transaction's end deals with it there); whether it did."""
        connection = connections[self.using]
        if _in_transaction(connection) or connection.connection is None \
                or connection.is_usable():
            return False
        connection.close()
        return True

    def _broken(self) -> bool:
        """After an error: whether the store's connection no longer works (closed here
        outside a transaction, :meth:`_close_broken`). Inside one, a PostgreSQL transaction
        that an error aborted counts as broken: its own error cannot be told apart there."""
        connection = connections[self.using]
        if connection.connection is None:
            return True
        if _in_transaction(connection):
            return not connection.is_usable()
        return self._close_broken()

    # -- locks -----------------------------------------------------------------------------

    @_reachable
    def acquire(self, key: str, owner: str, *, ttl: float | None = None,
                job_id: str = "") -> int | None:
        check_key(key)
        check_owner(owner)
        ttl = check_ttl(ttl)
        return self._dialect.acquire_lock(key, owner, ttl=ttl, job_id=job_id[:64])

    @_reachable
    def release(self, key: str, owner: str) -> bool:
        return self._dialect.release_lock(key, owner)

    @_reachable
    def extend(self, key: str, owner: str, *, ttl: float) -> bool:
        checked = check_ttl(ttl)
        held = Q(expires_at__isnull=True) | Q(expires_at__gt=clock.db_now())
        return bool(self._locks().filter(held, key=key, owner=owner).update(
            expires_at=_expiry(checked)))

    @_reachable
    def force_release(self, key: str) -> bool:
        return bool(self._locks().filter(key=key).exclude(owner="").update(owner="",
                                                                           expires_at=None))

    def _held(self):
        return self._locks().exclude(owner="").filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=clock.db_now())
        )

    def _info(self, row: Lock) -> LockInfo:
        return LockInfo(key=row.key, owner=row.owner, token=row.token,
                        acquired_at=row.acquired_at, expires_at=row.expires_at,
                        job_id=row.job_id, store=self.alias)

    @_reachable
    def get_lock(self, key: str) -> LockInfo | None:
        row = self._held().filter(key=key).first()
        return self._info(row) if row else None

    @_reachable
    def locks(self, prefix: str = "jobguard:", *, include_expired: bool = False) -> list[LockInfo]:
        qs = self._locks().exclude(owner="") if include_expired else self._held()
        return [self._info(row) for row in qs.filter(key__startswith=prefix).order_by("key")]

    @_reachable
    def lock_page(self, prefix: str = "jobguard:", *, cursor: str = "",
                  limit: int = 100) -> LockPage:
        """A keyset page in key order, on the key's unique index."""
        rows = list(self._locks().exclude(owner="").filter(
            key__gte=prefix, key__startswith=prefix, key__gt=cursor).order_by("key")[:limit + 1])
        page = rows[:limit]
        return LockPage([self._info(row) for row in page],
                        page[-1].key if len(rows) > limit else "")

    @_reachable
    def count_locks(self, prefix: str = "jobguard:", *, limit: int = 10_000) -> int:
        """A LIMITed count of the held rows: at most ``limit + 1`` rows read."""
        return self._held().filter(key__startswith=prefix)[:limit + 1].count()

    @_reachable
    def clean_expired(self) -> int:
        """Free expired locks (returns how many), and delete rows free for an hour.

        Freed rows stay for that hour so their key's token keeps counting from the row; after
        it, the clock floor alone is far above any token the deleted row had.
        """
        expired = self._locks().exclude(owner="").filter(expires_at__lte=clock.db_now()).update(
            owner="", expires_at=None)
        old = clock.db_now() - Value(datetime.timedelta(hours=1))
        self._locks().filter(owner="", acquired_at__lte=old)._raw_delete(self.using)
        return expired

    @_reachable
    def now(self) -> datetime.datetime:
        return self._dialect.now()

    # -- counters: rate-limit windows and exception circuits (see stores/counters.py) --------
    # Each write is one transaction: lock every row in key order (the dialect's row locks,
    # which create the missing rows), read the database clock, apply the rules, write back.
    # A deadlock, "database is locked" or a broken connection retries the transaction (unless
    # the caller's own transaction surrounds it). Reads that change nothing skip the
    # transaction.

    def _throttles(self):
        return Throttle.objects.using(self.using)

    def _now_us(self) -> int:
        # The dialect's, not now(): inside _serialized() an error must reach its retry as
        # the database's, not as StoreUnavailableError.
        return counters.to_us(self._dialect.now())

    def _locked(self, keys: list[str], kind: str) -> dict[str, ThrottleRow]:
        """Lock the rows of ``keys`` (made first where missing) in key order; ``{key: row}``."""
        return self._dialect.lock_throttles(keys, kind)

    def _peek(self, key: str) -> ThrottleRow | None:
        """The row of ``key`` without locking it (``None`` if there is none)."""
        return self._dialect.peek_throttle(key)

    def _write(self, key: str, *, kind: str, hits: int, limit: int, state: str, value: float,
               data: str, resets_at: int | None, expires_at: int) -> None:
        """Store a window's or circuit's new state (times in µs of the store clock)."""
        self._dialect.write_throttle(
            key, kind=kind, hits=hits, limit=limit, state=state, value=value, data=data,
            resets_at=counters.from_us(resets_at) if resets_at else None,
            expires_at=counters.from_us(expires_at))

    def _serialized(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` in a transaction, retried on deadlocks and busy databases, and on a
        new connection when the one it had is broken (a restart cut it, before this call or
        during it); not when its commit failed otherwise (it may have been applied)."""
        tries = 1 if _in_transaction(connections[self.using]) else 4
        for attempt in range(1, tries + 1):
            committing = False
            try:
                with transaction.atomic(using=self.using):
                    result = work()
                    committing = True
                return result
            except (DatabaseError, InterfaceError) as exc:
                # A commit that failed without a conflict (the connection was cut as it
                # committed) may have been applied: not applied twice by another try.
                if attempt == tries or (committing and not _conflict(exc)):
                    raise
                # A broken connection is closed (the transaction's rollback does that only
                # when it broke inside it), so the next try connects again.
                if not self._close_broken() and not isinstance(exc, OperationalError):
                    raise
                time.sleep(0.01 * attempt + random.random() * 0.02)
        raise AssertionError("unreachable")

    @_reachable
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
        return RateDecision(allowed=outcome.allowed, now=counters.from_us(outcome.now),
                            retry_after=outcome.wait / 1_000_000, blocked=outcome.blocked)

    def _circuit(self, row: ThrottleRow | None, now: int) -> counters.Circuit:
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

    @_reachable
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

    @_reachable
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

    @_reachable
    def throttles(self, prefix: str = "jobguard:") -> list[ThrottleInfo]:
        now = self._now_us()
        out = []
        for row in self._throttles().filter(key__startswith=prefix).order_by("key"):
            try:
                info = self._throttle_info(row, now)
            except (ValueError, TypeError, OverflowError):  # bad stored data: say so
                info = ThrottleInfo(key=row.key, kind=row.kind, hits=0, limit=row.limit,
                                    state=UNREADABLE, store=self.alias)
            if info is not None:
                out.append(info)
        return out

    def _throttle_info(self, row: Throttle, now: int) -> ThrottleInfo | None:
        if row.kind == "rate":
            decay = counters.us(row.value)
            seen = counters.describe_rate(counters.decode_log(row.data), now, decay)
            if seen is not None:
                return ThrottleInfo(key=row.key, kind="rate", hits=seen[0], limit=row.limit,
                                    resets_at=counters.from_us(seen[1]), store=self.alias)
        elif row.kind == "circuit":
            c = counters.describe_circuit(counters.decode_circuit(row.data), now,
                                          counters.us(row.value))
            if c is not None:
                return ThrottleInfo(key=row.key, kind="circuit", hits=c.failures,
                                    limit=row.limit, state=c.state,
                                    resets_at=counters.from_us(c.until), store=self.alias)
        return None

    @_reachable
    def reset_throttle(self, key: str) -> bool:
        return bool(self._throttles().filter(key=key).delete()[0])

    @_reachable
    def clean_expired_throttles(self) -> int:
        return self._throttles().filter(expires_at__lte=clock.db_now()).delete()[0]


def _circuit_decision(key: str, entry: counters.Entry) -> CircuitDecision:
    c = entry.circuit
    return CircuitDecision(key=key, state=c.state, failures=c.failures, admitted=entry.admitted,
                           probe=entry.probe, retry_after=entry.wait / 1_000_000,
                           until=counters.from_us(c.until) if c.until else None)
