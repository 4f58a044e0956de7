"""Locks and counters in Redis through a django-redis cache alias.

Every primitive is one Lua script, so check-and-set happens atomically on the server, and
expiry uses Redis's own clock (``TIME`` and key TTLs). A lock is a hash
``{owner, token, acquired_at, job_id}`` with a TTL; its fencing counter lives beside it in
``<key>:fence`` and never goes below the server time in microseconds, so tokens keep
increasing per key even after a Redis restart emptied the counter.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from django.core.checks import Error

from django_jobguard.stores.base import LockInfo, Store, check_key, check_owner, check_ttl

_ACQUIRE = """
local key, fence = KEYS[1], KEYS[2]
if redis.call('EXISTS', key) == 1 then return false end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', fence) or '0')
local token = math.max(last + 1, now_us)
redis.call('SET', fence, string.format('%d', token), 'EX', 604800)
redis.call('HSET', key, 'owner', ARGV[1], 'token', string.format('%d', token),
           'acquired_at', string.format('%d', now_us), 'job_id', ARGV[3])
local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
return string.format('%d', token)
"""

_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_EXTEND = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  local ttl = tonumber(ARGV[2])
  if ttl > 0 then return redis.call('PEXPIRE', KEYS[1], ttl) end
  return redis.call('PERSIST', KEYS[1]) + 1
end
return 0
"""


def _from_us(value: Any) -> datetime.datetime | None:
    if value in (None, b"", ""):
        return None
    return datetime.datetime.fromtimestamp(int(value) / 1_000_000, tz=datetime.UTC)


def _ms(ttl: float | None) -> int:
    """Milliseconds for PEXPIRE; 0 means no expiry, so a positive ttl is at least 1 ms."""
    return max(1, math.ceil(ttl * 1000)) if ttl else 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class RedisStore(Store):
    """Store on the Redis server behind the django-redis cache alias ``cache``."""

    def __init__(self, *, alias: str, cache: str = "default") -> None:
        super().__init__(alias=alias)
        self.cache_alias = cache
        self._client: Any = None
        self._scripts: dict[str, Any] = {}

    @classmethod
    def check_config(cls, alias: str, config: dict[str, Any]) -> list:
        from django.conf import settings

        cache = config.get("CACHE", "default")
        backend = settings.CACHES.get(cache, {}).get("BACKEND", "")
        if not backend.startswith("django_redis."):
            return [Error(
                f"JOBGUARD['STORES'][{alias!r}] uses cache {cache!r}, which is not a "
                f"django-redis cache (BACKEND is {backend or 'missing'!r}).",
                hint="pip install django-jobguard[redis] and set CACHES[...]['BACKEND'] = "
                     "'django_redis.cache.RedisCache'.",
                id="jobguard.E004",
            )]
        return []

    @property
    def client(self) -> Any:
        if self._client is None:
            from django_redis import get_redis_connection

            self._client = get_redis_connection(self.cache_alias)
        return self._client

    def _script(self, source: str) -> Any:
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self.client.register_script(source)
        return script

    def acquire(self, key: str, owner: str, *, ttl: float | None = None,
                job_id: str = "") -> int | None:
        check_key(key)
        check_owner(owner)
        token = self._script(_ACQUIRE)(keys=[key, f"{key}:fence"],
                                       args=[owner, _ms(check_ttl(ttl)), job_id])
        return int(token) if token else None

    def release(self, key: str, owner: str) -> bool:
        return bool(self._script(_RELEASE)(keys=[key], args=[owner]))

    def extend(self, key: str, owner: str, *, ttl: float) -> bool:
        return bool(self._script(_EXTEND)(keys=[key], args=[owner, _ms(check_ttl(ttl))]))

    def force_release(self, key: str) -> bool:
        return bool(self.client.delete(key))

    def get_lock(self, key: str) -> LockInfo | None:
        pipe = self.client.pipeline()
        pipe.hgetall(key)
        pipe.pttl(key)
        pipe.time()
        data, pttl, (seconds, micros) = pipe.execute()
        now = datetime.datetime.fromtimestamp(seconds + micros / 1_000_000, tz=datetime.UTC)
        return self._info(key, data, pttl, now) if data else None

    def _info(self, key: str, data: dict, pttl: int, now: datetime.datetime) -> LockInfo:
        data = {_text(k): v for k, v in data.items()}
        expires = now + datetime.timedelta(milliseconds=pttl) if pttl and pttl > 0 else None
        return LockInfo(key=key, owner=_text(data.get("owner")),
                        token=int(data.get("token") or 0),
                        acquired_at=_from_us(data.get("acquired_at")), expires_at=expires,
                        job_id=_text(data.get("job_id")), store=self.alias)

    def locks(self, prefix: str = "jobguard:", *, include_expired: bool = False) -> list[LockInfo]:
        """Held locks under ``prefix`` (expired ones are gone already: Redis drops them)."""
        keys = [_text(raw) for raw in self.client.scan_iter(match=f"{prefix}*", count=500)]
        keys = [key for key in keys if not key.endswith(":fence")]
        out = []
        now = self.now()
        for start in range(0, len(keys), 200):
            chunk = keys[start:start + 200]
            pipe = self.client.pipeline(transaction=False)
            for key in chunk:
                pipe.type(key)
                pipe.hgetall(key)
                pipe.pttl(key)
            replies = pipe.execute(raise_on_error=False)  # other keys may not be hashes
            for index, key in enumerate(chunk):
                kind, data, pttl = replies[3 * index:3 * index + 3]
                if (_text(kind) == "hash" and isinstance(data, dict)
                        and "owner" in {_text(k) for k in data}):
                    out.append(self._info(key, data, pttl, now))
        return sorted(out, key=lambda info: info.key)

    def clean_expired(self) -> int:
        return 0  # Redis drops expired keys itself

    def now(self) -> datetime.datetime:
        seconds, micros = self.client.time()
        return datetime.datetime.fromtimestamp(seconds + micros / 1_000_000, tz=datetime.UTC)
