"""Locks and counters in the database (the default store; works on SQLite too).

Each primitive is one conditional UPDATE (atomic on every database), or an INSERT that the
unique index on ``key`` makes atomic. Expiry compares with the database's ``now()``.
"""

from __future__ import annotations

import datetime
import time

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest, Now

from django_jobguard.models import Lock
from django_jobguard.stores.base import LockInfo, Store


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
