"""Locks and counters in Redis through a django-redis cache alias.

Every primitive is one Lua script, so check-and-set happens atomically on the server, and
expiry uses Redis's own clock (``TIME`` and key TTLs). A lock is a hash
``{owner, token, acquired_at, job_id}`` with a TTL; its fencing counter lives beside it in
``<key>:fence`` and never goes below the server time in microseconds, so tokens keep
increasing per key even after a Redis restart emptied the counter.

When the server cannot be reached (down, restarting, loading its data, timing out) every
primitive raises :class:`~django_jobguard.exceptions.StoreUnavailableError`, chained to the
redis error, so that the worker can tell an outage from a job's own failure.
"""

from __future__ import annotations

import datetime
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from django.core.checks import Error

from django_jobguard import clock
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.stores import counters, journal
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

try:  # redis is optional (django-jobguard[redis]); without it nothing here is called
    from redis.exceptions import ConnectionError as _ConnectionError
    from redis.exceptions import TimeoutError as _TimeoutError

    _OUTAGES: tuple[type[Exception], ...] = (_ConnectionError, _TimeoutError)
except ImportError:  # pragma: no cover
    _OUTAGES = ()


def _reachable(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the redis errors of an unreachable server (connection refused or lost, timeout,
    ``LOADING`` after a restart) into :class:`StoreUnavailableError`. Every other error, such
    as a script error, stays what it is."""

    @functools.wraps(method)
    def call(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except _OUTAGES as exc:
            raise StoreUnavailableError(self.alias, exc) from exc

    return call


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


def _ms(ttl: float | None) -> int:
    """Milliseconds for PEXPIRE; 0 means no expiry, so a positive ttl is at least 1 ms."""
    return max(1, math.ceil(ttl * 1000)) if ttl else 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class RedisStore(Store):
    """Store on the Redis server behind the django-redis cache alias ``cache``."""

    def __init__(self, *, alias: str, cache: str = "default", prefix: str = "") -> None:
        super().__init__(alias=alias)
        self.cache_alias = cache
        #: Put in front of every key this store writes in Redis (``STORES[...]["PREFIX"]``),
        #: so that test runs keep apart from the project's workers on the same server. Keys
        #: are shown and passed without it.
        self.prefix = prefix
        self._client: Any = None
        self._scripts: dict[str, Any] = {}

    @classmethod
    def check_config(cls, alias: str, config: dict[str, Any]) -> list:
        from django.conf import settings

        cache = config.get("CACHE", "default")
        prefix = config.get("PREFIX", "")
        if not isinstance(prefix, str):
            return [Error(f"JOBGUARD['STORES'][{alias!r}]['PREFIX'] must be a string, not "
                          f"{type(prefix).__name__}.", hint='For example "test:".',
                          id="jobguard.E004")]
        if cache not in settings.CACHES:
            return [Error(
                f"JOBGUARD['STORES'][{alias!r}] uses cache {cache!r}, which is not in CACHES "
                f"(CACHES has: {', '.join(map(repr, sorted(settings.CACHES))) or 'nothing'}).",
                hint=f"Add CACHES[{cache!r}] with BACKEND 'django_redis.cache.RedisCache', or "
                     f"set JOBGUARD['STORES'][{alias!r}]['CACHE'] to a django-redis cache "
                     f"alias you have.",
                id="jobguard.E004",
            )]
        backend = settings.CACHES[cache].get("BACKEND", "")
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

    @_reachable
    def acquire(self, key: str, owner: str, *, ttl: float | None = None,
                job_id: str = "") -> int | None:
        check_key(key)
        check_owner(owner)
        stored = self.prefix + key
        token = self._script(_ACQUIRE)(keys=[stored, f"{stored}:fence"],
                                       args=[owner, _ms(check_ttl(ttl)), job_id])
        if token and journal.scopes:  # a lock someone else holds is not the test's to undo
            journal.note(self, stored, f"{stored}:fence")
        return int(token) if token else None

    @_reachable
    def release(self, key: str, owner: str) -> bool:
        return bool(self._script(_RELEASE)(keys=[self.prefix + key], args=[owner]))

    @_reachable
    def extend(self, key: str, owner: str, *, ttl: float) -> bool:
        return bool(self._script(_EXTEND)(keys=[self.prefix + key],
                                          args=[owner, _ms(check_ttl(ttl))]))

    @_reachable
    def force_release(self, key: str) -> bool:
        return bool(self.client.delete(self.prefix + key))

    @_reachable
    def get_lock(self, key: str) -> LockInfo | None:
        pipe = self.client.pipeline()
        pipe.hgetall(self.prefix + key)
        pipe.pttl(self.prefix + key)
        pipe.time()
        data, pttl, (seconds, micros) = pipe.execute()
        now = datetime.datetime.fromtimestamp(seconds + micros / 1_000_000 + clock.offset(),
                                              tz=datetime.UTC)
        return self._info(key, data, pttl, now) if data else None

    def _info(self, key: str, data: dict, pttl: int, now: datetime.datetime) -> LockInfo:
        data = {_text(k): v for k, v in data.items()}
        expires = now + datetime.timedelta(milliseconds=pttl) if pttl and pttl > 0 else None
        return LockInfo(key=key, owner=_text(data.get("owner")),
                        token=int(data.get("token") or 0),
                        acquired_at=counters.from_us_or_none(data.get("acquired_at")),
                        expires_at=expires,
                        job_id=_text(data.get("job_id")), store=self.alias)

    @_reachable
    def locks(self, prefix: str = "jobguard:", *, include_expired: bool = False) -> list[LockInfo]:
        """Held locks under ``prefix`` (expired ones are gone already: Redis drops them)."""
        keys = [_text(raw) for raw in self.client.scan_iter(match=f"{self.prefix}{prefix}*",
                                                            count=500)]
        return sorted(self._infos(keys, self.now()), key=lambda info: info.key)

    @_reachable
    def lock_page(self, prefix: str = "jobguard:", *, cursor: str = "",
                  limit: int = 100) -> LockPage:
        """SCAN from ``cursor`` (Redis's own, as text) until about ``limit`` locks are found:
        a page may hold a few more, in key order within the page; SCAN's guarantee holds (a
        lock held all along is listed, possibly twice)."""
        if cursor and not cursor.isdigit():
            raise ValueError(f"{cursor!r} is not a cursor of the Redis store (a number).")
        position, found, count, now = int(cursor or 0), [], max(limit, 100), self.now()
        while True:
            position, raw = self.client.scan(position, match=f"{self.prefix}{prefix}*",
                                             count=count)
            batch = self._infos([_text(key) for key in raw], now)
            found += batch
            if position == 0 or len(found) >= limit:
                break
            if len(batch) < count // 4:  # a narrow prefix: look at more keys per call
                count = min(count * 4, 10_000)
        return LockPage(sorted(found, key=lambda info: info.key),
                        str(position) if position else "")

    def _infos(self, keys: list[str], now: datetime.datetime) -> list[LockInfo]:
        """The locks among ``keys`` (as stored, with :attr:`prefix`; fencing counters and other
        values left out)."""
        keys = [key for key in keys if not key.endswith(":fence")]
        out: list[LockInfo] = []
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
                    out.append(self._info(key[len(self.prefix):], data, pttl, now))
        return out

    def clean_expired(self) -> int:
        return 0  # Redis drops expired keys itself

    @_reachable
    def now(self) -> datetime.datetime:
        seconds, micros = self.client.time()
        return datetime.datetime.fromtimestamp(seconds + micros / 1_000_000 + clock.offset(),
                                               tz=datetime.UTC)

    @_reachable
    def shorten_ttls(self, seconds: float, prefix: str = "jobguard:") -> int:
        """Bring every expiry under ``prefix`` ``seconds`` closer (deleting what runs out):
        how the test clock moves Redis's TTLs along with its "now". Returns the keys changed."""
        keys = list(self.client.scan_iter(match=f"{self.prefix}{prefix}*", count=500))
        if not keys:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
        changed = 0
        pipe_set = self.client.pipeline(transaction=False)
        for key, pttl in zip(keys, pipe.execute(), strict=True):
            if pttl is None or pttl < 0:
                continue  # no expiry
            left = pttl - math.ceil(seconds * 1000)
            if left > 0:
                pipe_set.pexpire(key, left)
            else:
                pipe_set.delete(key)
            changed += 1
        pipe_set.execute()
        return changed

    # -- counters: rate-limit windows and exception circuits (see stores/counters.py) --------
    # One Lua script per primitive mirrors counters.py with the server's clock (TIME). State
    # is a plain string (``rate|limit|decay|log`` / ``circuit|max|decay|state``) so that lock
    # listings, which look at hashes, never mistake it for a lock.

    def _counter(self, source: str, keys: list[str], args: list[Any]) -> list[str]:
        return [_text(v) for v in self._script(source)(keys=keys, args=args)]

    @_reachable
    def hit_rate_limits(self, windows: Sequence[RateWindow], *,
                        _at: int | None = None) -> RateDecision:
        merged = counters.merge_windows(
            (w.key, w.limit, counters.us(w.decay)) for w in windows)
        keys = sorted(merged)
        args: list[Any] = [_script_now(_at)]
        for key in keys:
            args += list(merged[key])
        stored = [self.prefix + key for key in keys]
        reply = self._counter(_RATE_HIT, stored, args)
        if reply[0] == "1" and journal.scopes:  # refused: nothing was written
            journal.note(self, *stored)
        return RateDecision(allowed=reply[0] == "1", now=counters.from_us(reply[1]),
                            retry_after=int(reply[2]) / 1_000_000,
                            blocked=tuple(key[len(self.prefix):] for key in reply[3:]))

    @_reachable
    def circuit_enter(self, key: str, *, owner: str, max_attempts: int, decay: float,
                      probe_lease: float, _at: int | None = None) -> CircuitDecision:
        reply = self._counter(_CIRCUIT + _CIRCUIT_ENTER, [self.prefix + key], [
            _script_now(_at), owner, max_attempts, counters.us(decay),
            counters.us(probe_lease)])
        decision = _circuit_decision(key, reply)
        if decision.probe and journal.scopes:  # it wrote the half-open state
            journal.note(self, self.prefix + key)
        return decision

    @_reachable
    def circuit_leave(self, key: str, *, owner: str, outcome: str, max_attempts: int,
                      decay: float, _at: int | None = None) -> CircuitDecision:
        if outcome not in (counters.SUCCESS, counters.FAILURE, counters.NEUTRAL):
            raise ValueError(f"unknown circuit outcome {outcome!r}")
        if journal.scopes:
            journal.note(self, self.prefix + key)
        reply = self._counter(_CIRCUIT + _CIRCUIT_LEAVE, [self.prefix + key], [
            _script_now(_at), owner, max_attempts, counters.us(decay), outcome])
        return _circuit_decision(key, reply)

    @_reachable
    def throttles(self, prefix: str = "jobguard:") -> list[ThrottleInfo]:
        keys = sorted(_text(k) for k in self.client.scan_iter(
            match=f"{self.prefix}{prefix}*", count=500, _type="string"))
        now = counters.us(self.now().timestamp())
        out = []
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            for key, raw in zip(chunk, self.client.mget(chunk), strict=True):
                try:
                    info = self._throttle_info(key[len(self.prefix):], _text(raw), now)
                except (ValueError, TypeError, OverflowError):  # bad stored data: say so
                    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                    kind, _, rest = text.partition("|")
                    limit = rest.partition("|")[0]
                    info = ThrottleInfo(key=key[len(self.prefix):], kind=kind,
                                        limit=int(limit) if limit.isdigit() else 0,
                                        hits=0, state=UNREADABLE, store=self.alias)
                if info is not None:
                    out.append(info)
        return out

    def _throttle_info(self, key: str, raw: str, now: int) -> ThrottleInfo | None:
        kind, _, rest = raw.partition("|")
        if kind not in ("rate", "circuit") or rest.count("|") < 2:
            return None
        limit, decay, body = rest.split("|", 2)
        if kind == "rate":
            seen = counters.describe_rate(counters.decode_log(body), now, int(decay))
            if seen is None:
                return None
            return ThrottleInfo(key=key, kind="rate", hits=seen[0], limit=int(limit),
                                resets_at=counters.from_us(seen[1]), store=self.alias)
        c = counters.describe_circuit(counters.decode_circuit(body), now, int(decay))
        if c is None:
            return None
        return ThrottleInfo(key=key, kind="circuit", hits=c.failures, limit=int(limit),
                            state=c.state, resets_at=counters.from_us(c.until), store=self.alias)

    @_reachable
    def reset_throttle(self, key: str) -> bool:
        return bool(self._script(_RESET_THROTTLE)(keys=[self.prefix + key]))

    @_reachable
    def delete_keys(self, stored: list[str]) -> int:
        """Delete keys as stored (with :attr:`prefix`): how the testing API undoes what a test
        wrote (:mod:`django_jobguard.stores.journal`). Returns how many existed."""
        return int(self.client.delete(*stored)) if stored else 0


def _script_now(at: int | None) -> Any:
    """The ``now`` argument of a counter script: ``at``, the test clock's now, or '' for the
    server's ``TIME``."""
    if at is not None:
        return at
    shifted = clock.store_now_us()
    return "" if shifted is None else shifted


def _circuit_decision(key: str, reply: list[str]) -> CircuitDecision:
    admitted, probe, state, failures, until, wait = reply
    return CircuitDecision(key=key, state=state, failures=int(failures), admitted=admitted == "1",
                           probe=probe == "1", retry_after=int(wait) / 1_000_000,
                           until=counters.from_us(until) if int(until) else None)


# Lua for the counters, mirroring stores/counters.py. Numbers are microseconds (exact in
# Lua's doubles up to 2**53, i.e. until the year 2255) and always leave as '%d' strings.

_RATE_HIT = """
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) * 1000000 + tonumber(t[2]) end
local logs, newest = {}, 0
for i = 1, #KEYS do
  local log, raw = {}, redis.call('GET', KEYS[i])
  local body = raw and string.match(raw, '^rate|[^|]*|[^|]*|(.*)$') or ''
  for f, l, c in string.gmatch(body, '(%d+),(%d+),(%d+)') do
    local b = {tonumber(f), tonumber(l), tonumber(c)}
    log[#log + 1] = b
    if b[2] > newest then newest = b[2] end
  end
  logs[i] = log
end
if newest > now then now = newest end
local wait, blocked = 0, {}
for i = 1, #KEYS do
  local limit, decay = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local live, total = {}, 0
  for _, b in ipairs(logs[i]) do
    if b[2] > now - decay then live[#live + 1] = b; total = total + b[3] end
  end
  logs[i] = live
  if total >= limit then
    local need = total - limit + 1
    for _, b in ipairs(live) do
      need = need - b[3]
      if need <= 0 then
        if b[2] + decay - now > wait then wait = b[2] + decay - now end
        break
      end
    end
    blocked[#blocked + 1] = KEYS[i]
  end
end
if #blocked > 0 then
  return {'0', string.format('%d', now), string.format('%d', wait), unpack(blocked)}
end
for i = 1, #KEYS do
  local limit, decay = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local log = logs[i]
  local newest_bucket = log[#log]
  if newest_bucket and now < newest_bucket[1] + math.floor(decay / BUCKETS) then
    newest_bucket[2] = now
    newest_bucket[3] = newest_bucket[3] + 1
  else
    log[#log + 1] = {now, now, 1}
  end
  local parts = {}
  for j, b in ipairs(log) do parts[j] = string.format('%d,%d,%d', b[1], b[2], b[3]) end
  redis.call('SET', KEYS[i], string.format('rate|%d|%d|', limit, decay) ..
             table.concat(parts, ';'), 'PX', math.max(1, math.ceil(decay / 1000)))
end
return {'1', string.format('%d', now), '0'}
""".replace("BUCKETS", str(counters.BUCKETS))

# Shared head of both circuit scripts: read the clock and the state (forgotten once expired).
_CIRCUIT = """
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) * 1000000 + tonumber(t[2]) end
local owner, max_attempts, decay = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local state, failures, untl, probe = 'closed', 0, 0, ''
local raw = redis.call('GET', KEYS[1])
if raw then
  local d, s, f, u, p = string.match(raw, '^circuit|[^|]*|(%d+)|([^;]*);(%d+);(%d+);(.*)$')
  if s then
    local expires = tonumber(u)
    if s ~= 'closed' then expires = expires + math.max(tonumber(d), KEEP_OPEN) end
    if (s ~= 'closed' or tonumber(f) > 0) and now < expires then
      state, failures, untl, probe = s, tonumber(f), tonumber(u), p
    end
  end
end
local function reply(admitted, is_probe, wait)
  return {admitted, is_probe, state, string.format('%d', failures), string.format('%d', untl),
          string.format('%d', wait)}
end
-- The state knows when it expires (see above); the TTL only collects it, a minute late.
local function save()
  if state == 'closed' and failures == 0 then redis.call('DEL', KEYS[1]); return end
  local expires = untl
  if state ~= 'closed' then expires = untl + math.max(decay, KEEP_OPEN) end
  redis.call('SET', KEYS[1], string.format('circuit|%d|%d|%s;%d;%d;%s', max_attempts, decay,
             state, failures, untl, probe), 'PX', math.ceil((expires - now) / 1000) + 60000)
end
""".replace("KEEP_OPEN", str(counters.KEEP_OPEN))

_CIRCUIT_ENTER = """
local lease = tonumber(ARGV[5])
if state == 'closed' then
  if failures > 0 and now >= untl then
    state, failures, untl, probe = 'closed', 0, 0, ''
    save()
  end
  return reply('1', '0', 0)
end
if state == 'open' and now < untl then return reply('0', '0', untl - now) end
if state == 'half-open' and probe ~= '' and probe ~= owner and now < untl then
  return reply('0', '0', untl - now)
end
state, untl, probe = 'half-open', now + lease, owner
save()
return reply('1', '1', 0)
"""

_CIRCUIT_LEAVE = """
local outcome = ARGV[5]
local is_probe = state == 'half-open' and probe == owner
if outcome == 'success' then
  state, failures, untl, probe = 'closed', 0, 0, ''
elseif outcome == 'neutral' then
  if is_probe then untl, probe = now, '' end
elseif is_probe then
  state, failures, untl, probe = 'open', failures + 1, now + decay, ''
elseif state == 'closed' then
  if failures == 0 or now >= untl then failures, untl = 0, now + decay end
  failures = failures + 1
  if failures >= max_attempts then state, untl = 'open', now + decay end
else
  failures = failures + 1
end
save()
return reply('1', '0', 0)
"""

_RESET_THROTTLE = """
local raw = redis.call('GET', KEYS[1])
if raw and (string.sub(raw, 1, 5) == 'rate|' or string.sub(raw, 1, 8) == 'circuit|') then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
