"""Locks and counters in Redis: one server or a Sentinel set through a django-redis cache
alias (``CACHE``), or a Redis Cluster through redis-py's ``RedisCluster`` (``CLUSTER``).

Every primitive is one Lua script, so check-and-set happens atomically on the server, and
expiry uses Redis's own clock (``TIME`` and key TTLs). A lock is a hash
``{owner, token, acquired_at, job_id, call}`` (``call``: the acquire that took it) with a
TTL; its fencing counter lives beside it in :func:`fence_key` (``{<key>}:fence``: the same
hash slot as the lock, so the acquiring script touches one slot of a Cluster) and never goes
below the server time in microseconds, so tokens keep increasing per key even after a Redis
restart (or a failover to a replica that had not received the counter yet) emptied the
counter.

Every script's keys are in one hash slot: a lock and its fence (above), a circuit (one key),
and the rate windows of one hit, grouped by slot on a Cluster (see
:meth:`RedisStore.hit_rate_limits`).

A store's ``PREFIX`` goes in front of every key it writes or reads (``prefix + key``; keys are
shown and passed without it). Everything about slots is worked out on the key as stored: the
fence is ``fence_key(prefix + key)`` and rate windows are grouped by the stored key's slot. The
prefix may not hold ``{`` or ``}`` (E004), so a key's own hash tag stays its tag behind it.

When the server cannot be reached (down, restarting, loading its data, timing out) every
primitive raises :class:`~django_jobguard.exceptions.StoreUnavailableError`, chained to the
redis error, so that the worker can tell an outage from a job's own failure.
"""

from __future__ import annotations

import binascii
import datetime
import functools
import math
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from django.core.checks import Error, Warning
from django.core.exceptions import ImproperlyConfigured

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
    from redis.exceptions import AskError as _AskError
    from redis.exceptions import ClusterDownError as _ClusterDownError
    from redis.exceptions import ConnectionError as _ConnectionError
    from redis.exceptions import MovedError as _MovedError
    from redis.exceptions import ResponseError as _ResponseError
    from redis.exceptions import SlotNotCoveredError as _SlotNotCoveredError
    from redis.exceptions import TimeoutError as _TimeoutError
    from redis.exceptions import TryAgainError as _TryAgainError

    # Sentinel's MasterNotFoundError is a ConnectionError; a Cluster whose slots are not all
    # served (a master down, a failover under way) answers CLUSTERDOWN / TRYAGAIN.
    _OUTAGES: tuple[type[Exception], ...] = (_ConnectionError, _TimeoutError, _ClusterDownError,
                                             _SlotNotCoveredError, _TryAgainError)
    _REPLIES: tuple[type[Exception], ...] = (_ResponseError,)
    _REDIRECTS: tuple[type[Exception], ...] = (_MovedError, _AskError)
except ImportError:  # pragma: no cover
    _OUTAGES = _REPLIES = _REDIRECTS = ()


class RedisTopologyError(ImproperlyConfigured):
    """The Redis behind a store is not the topology its configuration says (a Cluster node
    reached through a ``CACHE``, a server without cluster mode named in ``CLUSTER``)."""


def _reachable(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the redis errors of an unreachable server (connection refused or lost, timeout,
    ``LOADING`` after a restart, a Cluster that is down or a Sentinel without a master) into
    :class:`StoreUnavailableError`, and a Cluster's ``MOVED``/``CROSSSLOT`` reply to a client
    that does not speak Cluster into :class:`RedisTopologyError`. Every other error, such as a
    script error, stays what it is."""

    @functools.wraps(method)
    def call(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except _OUTAGES as exc:
            raise StoreUnavailableError(self.alias, exc) from exc
        except _REPLIES as exc:
            if not self.is_cluster and (isinstance(exc, _REDIRECTS)
                                        or str(exc).startswith(("MOVED", "ASK ", "CROSSSLOT"))):
                raise RedisTopologyError(
                    f"Store {self.alias!r}: the Redis behind cache {self.cache_alias!r} is a "
                    f"Cluster node ({exc}); configure the store with 'CLUSTER' (redis-py's "
                    "RedisCluster) instead of 'CACHE' (docs/scale-out.md).") from exc
            raise

    return call


def hash_tag(key: str) -> str:
    """The part of ``key`` that Redis Cluster hashes: the text between the first ``{`` and the
    first ``}`` after it when that is not empty, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


def key_slot(key: str) -> int:
    """The Cluster hash slot of ``key`` (CRC16 of its :func:`hash_tag`, mod 16384)."""
    return binascii.crc_hqx(hash_tag(key).encode(), 0) % 16384


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    """For each of the 16384 slots, a short hash tag that lands in it (computed once)."""
    tags: list[str | None] = [None] * 16384
    missing, number = 16384, 0
    while missing:
        text = str(number)
        slot = binascii.crc_hqx(text.encode(), 0) % 16384
        if tags[slot] is None:
            tags[slot], missing = text, missing - 1
        number += 1
    return tuple(tag or "" for tag in tags)


def fence_key(key: str) -> str:
    """The fencing counter of lock ``key``, in the same Cluster hash slot as ``key``:
    ``<key>:fence`` when ``key`` has a hash tag, ``{<key>}:fence`` when it has no ``}``
    (every key jobguard builds from plain ids), else ``{<tag of its slot>}:fence:<key>``."""
    if hash_tag(key) != key:
        return f"{key}:fence"
    if key and "}" not in key:
        return f"{{{key}}}:fence"
    return f"{{{_slot_tags()[key_slot(key)]}}}:fence:{key}"


# ARGV[4] names this call: the same call sent again by redis-py's retry after a cut connection
# (the lock taken, its answer lost) gets the lock it took, not "held by someone else" (its own
# lock left held until its TTL, for ever without one). Another call fails even for the same
# owner: locks are not re-entrant.
_ACQUIRE = """
local key, fence = KEYS[1], KEYS[2]
if redis.call('EXISTS', key) == 1 then
  if redis.call('TYPE', key).ok == 'hash' and redis.call('HGET', key, 'call') == ARGV[4] then
    return redis.call('HGET', key, 'token')
  end
  return false
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', fence) or '0')
local token = math.max(last + 1, now_us)
redis.call('SET', fence, string.format('%d', token), 'EX', 604800)
redis.call('HSET', key, 'owner', ARGV[1], 'token', string.format('%d', token),
           'acquired_at', string.format('%d', now_us), 'job_id', ARGV[3], 'call', ARGV[4])
local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
return string.format('%d', token)
"""

_GET_LOCK = """
return {redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('TIME')}
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
    """Store on the Redis behind the django-redis cache alias ``cache`` (one server, or a
    Sentinel set through django-redis's ``SentinelClient``), or on the Redis Cluster at
    ``cluster`` (a ``redis://`` URL or a list of them, for redis-py's ``RedisCluster``;
    ``cluster_options`` are passed to it)."""

    cleans_itself = True  # Redis drops expired keys itself
    lost_answers_may_apply = True

    def __init__(self, *, alias: str, cache: str = "default",
                 cluster: str | Sequence[str] | None = None,
                 cluster_options: dict[str, Any] | None = None, prefix: str = "") -> None:
        super().__init__(alias=alias)
        self.cache_alias = cache
        self.cluster_urls = [cluster] if isinstance(cluster, str) else list(cluster or [])
        self.cluster_options = dict(cluster_options or {})
        self.is_cluster = bool(self.cluster_urls)
        #: Put in front of every key this store writes in Redis (``STORES[...]["PREFIX"]``),
        #: so that test runs keep apart from the project's workers on the same server. Keys
        #: are shown and passed without it. A lock's fencing counter is
        #: ``fence_key(prefix + key)``: in the hash slot of the prefixed key.
        self.prefix = prefix
        self._glob = re.sub(r"([*?\[\]\\])", r"\\\1", prefix)  # the prefix in a SCAN pattern
        self._client: Any = None
        self._scripts: dict[str, Any] = {}

    @classmethod
    def check_config(cls, alias: str, config: dict[str, Any]) -> list:
        """System checks of the store's options and topology (E004; E140-E142 and W140 in
        docs/scale-out.md)."""
        prefix = config.get("PREFIX", "")
        if not isinstance(prefix, str):
            return [Error(f"JOBGUARD['STORES'][{alias!r}]['PREFIX'] must be a string, not "
                          f"{type(prefix).__name__}.", hint='For example "test:".',
                          id="jobguard.E004")]
        if "{" in prefix or "}" in prefix:
            return [Error(f"JOBGUARD['STORES'][{alias!r}]['PREFIX'] is {prefix!r}: it must not "
                          "contain '{' or '}'. On a Redis Cluster a brace in front of every "
                          "key would change their hash tags, so keys that share a slot "
                          "without the prefix would not with it (or all would share one).",
                          hint='For example "test:".', id="jobguard.E004")]
        if "CLUSTER" in config:
            return _check_cluster(alias, config)
        from django.conf import settings

        cache = config.get("CACHE", "default")
        if cache not in settings.CACHES:
            return [Error(
                f"JOBGUARD['STORES'][{alias!r}] uses cache {cache!r}, which is not in CACHES "
                f"(CACHES has: {', '.join(map(repr, sorted(settings.CACHES))) or 'nothing'}).",
                hint=f"Add CACHES[{cache!r}] with BACKEND 'django_redis.cache.RedisCache', or "
                     f"set JOBGUARD['STORES'][{alias!r}]['CACHE'] to a django-redis cache "
                     f"alias you have.",
                id="jobguard.E004",
            )]
        cache_config = settings.CACHES[cache]
        backend = cache_config.get("BACKEND", "")
        if not backend.startswith("django_redis."):
            return [Error(
                f"JOBGUARD['STORES'][{alias!r}] uses cache {cache!r}, which is not a "
                f"django-redis cache (BACKEND is {backend or 'missing'!r}).",
                hint="pip install django-jobguard[redis] and set CACHES[...]['BACKEND'] = "
                     "'django_redis.cache.RedisCache'.",
                id="jobguard.E004",
            )]
        return _check_cache_topology(alias, cache, cache_config,
                                     getattr(settings, "DJANGO_REDIS_CONNECTION_FACTORY", ""))

    @property
    def client(self) -> Any:
        if self._client is None:
            if self.is_cluster:
                self._client = self._cluster_client()
            else:
                from django_redis import get_redis_connection

                self._client = get_redis_connection(self.cache_alias)
        return self._client

    def _cluster_client(self) -> Any:
        from redis.cluster import ClusterNode, RedisCluster
        from redis.exceptions import RedisClusterException

        nodes = []
        for url in self.cluster_urls:
            parsed = urlsplit(url)
            nodes.append(ClusterNode(parsed.hostname or "127.0.0.1", parsed.port or 6379))
        first = urlsplit(self.cluster_urls[0])
        options = {"password": first.password, "username": first.username or None,
                   "ssl": first.scheme == "rediss", **self.cluster_options}
        try:
            return RedisCluster(startup_nodes=nodes, **options)
        except RedisClusterException as exc:
            if "not enabled" in str(exc) or "Cluster mode" in str(exc):
                raise RedisTopologyError(
                    f"Store {self.alias!r}: {', '.join(self.cluster_urls)} is not a Redis "
                    f"Cluster ({exc}); use 'CACHE' (a django-redis cache) for one server or "
                    "a Sentinel set.") from exc
            raise StoreUnavailableError(self.alias, exc) from exc

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
        token = self._script(_ACQUIRE)(keys=[stored, fence_key(stored)],
                                       args=[owner, _ms(check_ttl(ttl)), job_id,
                                             uuid.uuid4().hex])
        if token and journal.scopes:  # a lock someone else holds is not the test's to undo
            journal.note(self, stored, fence_key(stored))
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
        # One script, so the hash, its TTL and the clock come from the node that holds the
        # lock (on a Cluster another node's clock may differ).
        flat, pttl, (seconds, micros) = self._script(_GET_LOCK)(keys=[self.prefix + key])
        if not flat:
            return None
        data = dict(zip(flat[::2], flat[1::2], strict=True))
        now = datetime.datetime.fromtimestamp(int(seconds) + int(micros) / 1_000_000
                                              + clock.offset(), tz=datetime.UTC)
        return self._info(key, data, int(pttl), now)

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
        keys = [_text(raw) for raw in self.client.scan_iter(match=f"{self._glob}{prefix}*",
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
            position, raw = self._scan(position, f"{self._glob}{prefix}*", count)
            batch = self._infos([_text(key) for key in raw], now)
            found += batch
            if position == 0 or len(found) >= limit:
                break
            if len(batch) < count // 4:  # a narrow prefix: look at more keys per call
                count = min(count * 4, 10_000)
        return LockPage(sorted(found, key=lambda info: info.key),
                        str(position) if position else "")

    def _scan(self, position: int, match: str, count: int) -> tuple[int, list]:
        """One ``SCAN`` step. On a Cluster the cursor is ``<master index> << 64 | <that
        master's cursor>`` over the masters in name order, one master after the other (a
        resharding or failover between two pages may list a lock twice or, like any change
        of masters, skip one)."""
        if not self.is_cluster:
            return self.client.scan(position, match=match, count=count)
        masters = sorted(self.client.get_primaries(), key=lambda node: node.name)
        index, node_cursor = position >> 64, position & (2**64 - 1)
        if index >= len(masters):
            return 0, []
        cursors, raw = self.client.scan(node_cursor, match=match, count=count,
                                        target_nodes=masters[index])
        node_cursor = int(next(iter(cursors.values()), 0))
        if node_cursor == 0:
            index, node_cursor = index + 1, 0
            if index >= len(masters):
                return 0, raw
        return index << 64 | node_cursor, raw

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

    @_reachable
    def clean_expired(self) -> int:
        """0: Redis drops expired keys itself. The server is still asked (``PING``), so that
        a store that cannot be reached says so (``StoreUnavailableError``) instead of
        reporting that nothing was left to remove (``jobs_locks --clean``; the workers'
        housekeeping does not call it: :attr:`cleans_itself`)."""
        self.client.ping()
        return 0

    @_reachable
    def now(self) -> datetime.datetime:
        seconds, micros = self.client.time()
        return datetime.datetime.fromtimestamp(seconds + micros / 1_000_000 + clock.offset(),
                                               tz=datetime.UTC)

    @_reachable
    def shorten_ttls(self, seconds: float, prefix: str = "jobguard:") -> int:
        """Bring every expiry under ``prefix`` ``seconds`` closer (deleting what runs out):
        how the test clock moves Redis's TTLs along with its "now". Returns the keys changed."""
        keys = list(self.client.scan_iter(match=f"{self._glob}{prefix}*", count=500))
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

    def _counter_once(self, source: str, keys: list[str], args: list[Any]) -> list[str]:
        """:meth:`_counter` applied at most once however often redis-py sends it, for the
        hit given back (:data:`_RATE_UNDO`): a connection cut after the server ran it but
        before the reply came back makes redis-py's retry (a ``RedisCluster``'s by default,
        a ``Retry`` configured on the connection pool otherwise) send it again, which would
        give back a second hit, one nobody gave back: a limit passed. The script keeps its
        reply under a key of its own for the call (:func:`_once`); a second run finds it and
        answers the same. (A hit or a circuit's outcome sent twice counts twice: an
        over-count, which delays one job by a slot and costs no key per call on the path
        every rate-limited job takes.)"""
        call = _call_key(self.prefix, keys[0], uuid.uuid4().hex)
        if journal.scopes:
            journal.note(self, call)
        return [_text(v) for v in self._script(_once(source))(keys=[*keys, call], args=args)]

    @_reachable
    def hit_rate_limits(self, windows: Sequence[RateWindow], *,
                        _at: int | None = None) -> RateDecision:
        merged = counters.merge_windows(
            (w.key, w.limit, counters.us(w.decay)) for w in windows)
        keys = sorted(merged)
        now_arg = _script_now(_at)
        groups: dict[int, list[str]] = {}
        for key in keys:  # one script per hash slot (of the key as stored) on a Cluster
            groups.setdefault(key_slot(self.prefix + key) if self.is_cluster else 0,
                              []).append(key)
        if not groups:
            groups[0] = []  # no window: the script only reads the clock
        hits: list[tuple[list[str], str]] = []  # (stored keys, now) of the groups hit so far
        latest, order, cut = 0, sorted(groups), len(self.prefix)
        for index, slot in enumerate(order):
            stored = [self.prefix + key for key in groups[slot]]
            reply = self._counter(_RATE_HIT, stored, _rate_args(groups[slot], merged, now_arg))
            latest = max(latest, int(reply[1]))
            if reply[0] == "1":
                if journal.scopes:  # written, and still there if given back below
                    journal.note(self, *stored)
                hits.append((stored, reply[1]))
                continue
            # Refused. On a Cluster, give back the hits of the slots before (a concurrent hit
            # may have been refused meanwhile: a limit is never passed), and ask the slots
            # after, without hitting them, which of their windows refuse too and how long.
            for done, at in hits:
                self._counter_once(_RATE_UNDO, done, [at])
            wait, blocked = int(reply[2]), [key[cut:] for key in reply[3:]]
            for later in order[index + 1:]:
                check = self._counter(_RATE_HIT, [self.prefix + key for key in groups[later]],
                                      [*_rate_args(groups[later], merged, now_arg), "check"])
                latest = max(latest, int(check[1]))
                wait, blocked = max(wait, int(check[2])), blocked + [key[cut:]
                                                                     for key in check[3:]]
            return RateDecision(allowed=False, now=counters.from_us(latest),
                                retry_after=wait / 1_000_000, blocked=tuple(sorted(blocked)))
        return RateDecision(allowed=True, now=counters.from_us(latest), retry_after=0.0,
                            blocked=())

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
            match=f"{self._glob}{prefix}*", count=500, _type="string"))
        now = counters.us(self.now().timestamp())
        out = []
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            values = (self.client.mget_nonatomic(chunk) if self.is_cluster
                      else self.client.mget(chunk))
            for key, raw in zip(chunk, values, strict=True):
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
        wrote (:mod:`django_jobguard.stores.journal`). Returns how many existed. On a Cluster
        one ``DEL`` per hash slot: a ``DEL`` of keys in several slots is refused
        (``CROSSSLOT``)."""
        if not self.is_cluster:
            return int(self.client.delete(*stored)) if stored else 0
        by_slot: dict[int, list[str]] = {}
        for key in stored:
            by_slot.setdefault(key_slot(key), []).append(key)
        return sum(int(self.client.delete(*keys)) for keys in by_slot.values())


# -- system checks of the topology (manage.py check; ids listed in docs/scale-out.md) -------

_SENTINEL_FACTORY = "django_redis.pool.SentinelConnectionFactory"


def _check_cluster(alias: str, config: dict[str, Any]) -> list:
    """jobguard.E140: ``CLUSTER`` beside ``CACHE``, or not ``redis://host:port`` URL(s)."""
    where = f"JOBGUARD['STORES'][{alias!r}]"
    if "CACHE" in config:
        return [Error(f"{where} sets both 'CACHE' and 'CLUSTER'.",
                      hint="'CACHE' names a django-redis cache (one server or Sentinel); "
                           "'CLUSTER' the Redis Cluster's URLs. Keep one.",
                      id="jobguard.E140")]
    urls = config["CLUSTER"]
    urls = [urls] if isinstance(urls, str) else urls
    bad = ([repr(urls)] if not isinstance(urls, list | tuple) or not urls else
           [repr(url) for url in urls if not _is_node_url(url)])
    if bad:
        return [Error(f"{where}['CLUSTER'] must be a redis:// URL of a Cluster node or a "
                      f"non-empty list of them; got {', '.join(bad)}.",
                      hint="For example 'redis://10.0.0.1:7000' (a database number is not "
                           "allowed: a Cluster has only database 0).", id="jobguard.E140")]
    options = config.get("CLUSTER_OPTIONS", {})
    if not isinstance(options, dict):
        return [Error(f"{where}['CLUSTER_OPTIONS'] must be a dict of RedisCluster keyword "
                      f"arguments, not {type(options).__name__}.", id="jobguard.E140")]
    return []


def _is_node_url(url: Any) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parsed = urlsplit(url)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return (parsed.scheme in ("redis", "rediss") and bool(parsed.hostname)
            and parsed.path.strip("/") in ("", "0"))


def _check_cache_topology(alias: str, cache: str, cache_config: dict[str, Any],
                          global_factory: str) -> list:
    """jobguard.E141 (client-side sharding), E142 (a Sentinel client set up wrongly) and
    W140 (Sentinel without a quorum of its own) for the django-redis cache ``cache``."""
    where = f"JOBGUARD['STORES'][{alias!r}] (cache {cache!r})"
    options = cache_config.get("OPTIONS") or {}
    client_class = str(options.get("CLIENT_CLASS", ""))
    if client_class.endswith("ShardedClient"):
        return [Error(f"{where} uses django-redis's ShardedClient: it spreads keys over "
                      "servers by its own hash, so a lock and its fencing counter, or the "
                      "windows of one rate-limit hit, may land on different servers and no "
                      "script sees them together.",
                      hint="Use a Redis Cluster ('CLUSTER' in the store) or one server.",
                      id="jobguard.E141")]
    factory = str(options.get("CONNECTION_FACTORY") or global_factory or "")
    sentinel_client = client_class.endswith("SentinelClient")
    sentinel_factory = factory.endswith("SentinelConnectionFactory")
    if not sentinel_client and not sentinel_factory:
        return []
    problems = []
    if not sentinel_client:
        problems.append("its CONNECTION_FACTORY is Sentinel's but its CLIENT_CLASS is not "
                        "'django_redis.client.SentinelClient'")
    if not sentinel_factory:
        problems.append(f"its CLIENT_CLASS is SentinelClient but the connection factory is "
                        f"{factory or 'the default'!r}, not {_SENTINEL_FACTORY!r}")
    sentinels = options.get("SENTINELS") or []
    if not sentinels or not isinstance(sentinels, list | tuple):
        problems.append("OPTIONS['SENTINELS'] is not a non-empty list of (host, port)")
    location = cache_config.get("LOCATION", "")
    if not isinstance(location, str) or "is_master=0" in location:
        problems.append("LOCATION must be one 'redis://<master name>/<db>' URL naming the "
                        "master (the store writes; a replica refuses writes)")
    if problems:
        return [Error(f"{where} is a Sentinel set up wrongly: {'; '.join(problems)}.",
                      hint="docs/scale-out.md#sentinel shows a working CACHES entry.",
                      id="jobguard.E142")]
    if len(sentinels) < 3:
        return [Warning(f"{where} names {len(sentinels)} sentinel(s): a failover needs a "
                        "majority of the sentinels to agree, so fewer than 3 cannot survive "
                        "losing one, or promote a replica while the old master still takes "
                        "writes on the other side of a partition.",
                        hint="Run 3 or more sentinels on separate hosts.",
                        id="jobguard.W140")]
    return []


#: How long a hit given back keeps its reply for a retry of the same call (milliseconds):
#: far longer than redis-py's retries take (a ``RedisCluster``'s 10 by default in redis-py
#: 8, each after its connect and socket timeouts and a backoff of up to 1 s: 80 s with
#: timeouts of 2 and 5 s). One small key per hit given back, which only a Cluster's limit
#: over several hash slots that one of them refused gives.
ONCE_TTL_MS = 900_000


def _call_key(prefix: str, stored: str, call: str) -> str:
    """The key a counting call keeps its reply under: ``<prefix>{<tag>}:call:<call>``, in
    the hash slot of ``stored`` (its :func:`hash_tag`, or a tag of its slot when that has a
    ``}``), outside ``<prefix>jobguard:`` so that no listing scans it."""
    tag = hash_tag(stored)
    if "}" in tag:
        tag = _slot_tags()[key_slot(stored)]
    return f"{prefix}{{{tag}}}:call:{call}"


@functools.cache
def _once(source: str) -> str:
    """``source`` (a script whose ``KEYS`` are its own) run at most once per call: its last
    key is the call's (:func:`_call_key`), taken off ``KEYS`` before ``source`` runs. A call
    whose reply is kept there already (the same call sent again after a cut connection)
    gets that reply, and ``source`` does not run again."""
    return f"""
local call = KEYS[#KEYS]
KEYS[#KEYS] = nil
local kept = redis.call('GET', call)
if kept then return cjson.decode(kept) end
local reply = (function()
{source}
end)()
redis.call('SET', call, cjson.encode(reply), 'PX', {ONCE_TTL_MS})
return reply
"""


def _rate_args(keys: list[str], merged: dict[str, Any], now: Any) -> list[Any]:
    """ARGV of :data:`_RATE_HIT`: now, then limit and decay of each key."""
    args: list[Any] = [now]
    for key in keys:
        args += list(merged[key])
    return args


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
if #ARGV > 2 * #KEYS + 1 then return {'1', string.format('%d', now), '0'} end  -- check only
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

# Gives back one hit made at ARGV[1] (microseconds) in each window of KEYS: the bucket that
# took it loses one (and goes when empty); the key keeps its TTL.
_RATE_UNDO = """
local at = tonumber(ARGV[1])
for i = 1, #KEYS do
  local raw = redis.call('GET', KEYS[i])
  local head, body = nil, nil
  if raw then head, body = string.match(raw, '^(rate|[^|]*|[^|]*|)(.*)$') end
  if head then
    local log = {}
    for f, l, c in string.gmatch(body, '(%d+),(%d+),(%d+)') do
      log[#log + 1] = {tonumber(f), tonumber(l), tonumber(c)}
    end
    for j = #log, 1, -1 do
      if log[j][1] <= at then
        log[j][3] = log[j][3] - 1
        if log[j][3] <= 0 then table.remove(log, j) end
        break
      end
    end
    local parts = {}
    for j, b in ipairs(log) do parts[j] = string.format('%d,%d,%d', b[1], b[2], b[3]) end
    redis.call('SET', KEYS[i], head .. table.concat(parts, ';'), 'KEEPTTL')
  end
end
return {'1'}
"""

_RESET_THROTTLE = """
local raw = redis.call('GET', KEYS[1])
if raw and (string.sub(raw, 1, 5) == 'rate|' or string.sub(raw, 1, 8) == 'circuit|') then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
