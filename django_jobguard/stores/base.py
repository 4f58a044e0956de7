"""The store interface: owner-checked locks with fencing tokens, and counters.

A store is the small set of atomic primitives that locks, unique jobs and limits need.
Expiry always uses the store's own clock, never the calling process's.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from django_jobguard import durations, keys

#: Longest lock key every store accepts (the ``Lock.key`` column).
MAX_KEY_LENGTH = 255
#: Longest owner token (the ``Lock.owner`` column).
MAX_OWNER_LENGTH = 100


def check_key(key: str) -> str:
    """``key`` if it can name a lock in every store, else ``ValueError`` saying why."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"A lock key must be a non-empty string, not {key!r}.")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"Lock key is {len(key)} characters, over the limit of {MAX_KEY_LENGTH}: "
                         f"{key[:80]}... Use a shorter (e.g. hashed) id.")
    return key


def check_owner(owner: str) -> str:
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"A lock owner must be a non-empty string, not {owner!r}.")
    if len(owner) > MAX_OWNER_LENGTH:
        raise ValueError(f"Lock owner is {len(owner)} characters, over {MAX_OWNER_LENGTH}.")
    return owner


def check_ttl(ttl: float | None) -> float | None:
    """Seconds as a float (``None``/0 = no expiry), or ``ValueError`` for a bad value."""
    return durations.seconds(ttl, name="A lock ttl", allow_none=True) or None


@dataclass(frozen=True)
class LockInfo:
    """A held lock as listed by :meth:`Store.locks`."""

    key: str
    owner: str
    token: int
    acquired_at: datetime.datetime | None
    expires_at: datetime.datetime | None
    job_id: str = ""
    store: str = ""

    def expired(self, now: datetime.datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    @property
    def kind(self) -> str:
        """``unique``, ``overlap`` or ``other`` from the key's prefix."""
        return keys.kind(self.key)


@dataclass(frozen=True)
class LockPage:
    """One page of :meth:`Store.lock_page`: its locks, and the ``cursor`` the next page
    starts from (``""``: this was the last)."""

    locks: list[LockInfo]
    cursor: str = ""


#: The state :meth:`Store.throttles` gives a window or circuit whose stored state cannot be
#: decoded (bad stored data): listed so an operator sees it and can reset it, never a crash.
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class ThrottleInfo:
    """A rate-limit window or an exception circuit as listed by :meth:`Store.throttles`."""

    key: str
    kind: str  # "rate" or "circuit"
    hits: int  # requests in the window / failures counted
    limit: int  # allowed per window / failures before the circuit opens
    state: str = ""  # circuits: "closed", "open" or "half-open"; UNREADABLE: bad stored data
    resets_at: datetime.datetime | None = None  # window frees / circuit may close
    store: str = ""


class Store:
    """Base class; subclasses implement each primitive atomically."""

    #: Whether the backend drops expired locks and windows itself (Redis): the workers'
    #: housekeeping then leaves the store alone (its heartbeat thread, which renews the
    #: leases, makes no call to it).
    cleans_itself = False
    #: Whether a write whose answer a cut connection lost may have been applied (Redis: the
    #: server ran the script, the reply never came): :class:`WithoutOverlapping` then frees
    #: the lock its failed acquire may have taken. (A database store's failed statement is
    #: rolled back, and a statement after it would run in its caller's broken transaction.)
    lost_answers_may_apply = False

    def __init__(self, *, alias: str) -> None:
        self.alias = alias

    def acquire(self, key: str, owner: str, *, ttl: float | None = None,
                job_id: str = "") -> int | None:
        """Take ``key`` for ``owner`` if it is free or expired. Returns a fencing token larger
        than any earlier holder's, or ``None`` when someone else holds the lock.
        ``ttl`` seconds (``None``/0 = until released). Re-acquiring a lock you hold fails
        too: locks are not re-entrant."""
        raise NotImplementedError

    def release(self, key: str, owner: str) -> bool:
        """Free ``key`` only if ``owner`` still holds it."""
        raise NotImplementedError

    def extend(self, key: str, owner: str, *, ttl: float) -> bool:
        """Set the expiry of ``key`` to ``ttl`` seconds from now (0 = never) if ``owner``
        holds it and it has not expired (renewal)."""
        raise NotImplementedError

    def force_release(self, key: str) -> bool:
        """Free ``key`` whoever holds it (operators, stuck locks)."""
        raise NotImplementedError

    def get_lock(self, key: str) -> LockInfo | None:
        """The current holder of ``key``, or ``None`` if free or expired."""
        raise NotImplementedError

    def locks(self, prefix: str = "jobguard:", *, include_expired: bool = False) -> list[LockInfo]:
        """Locks whose key starts with ``prefix``."""
        raise NotImplementedError

    def lock_page(self, prefix: str = "jobguard:", *, cursor: str = "",
                  limit: int = 100) -> LockPage:
        """About ``limit`` locks under ``prefix`` (expired ones too, where the store keeps
        them), from ``cursor`` (the previous page's; ``""`` for the first). Pages cost what
        they hold, not what the store holds: a keyset in SQL, SCAN in Redis. This fallback,
        for stores with only :meth:`locks`, reads them all."""
        infos = [i for i in self.locks(prefix, include_expired=True) if i.key > cursor]
        return LockPage(infos[:limit], infos[limit - 1].key if len(infos) > limit else "")

    def count_locks(self, prefix: str = "jobguard:", *, limit: int = 10_000) -> int:
        """How many locks under ``prefix`` are held, counted up to ``limit + 1`` (the
        dashboard shows "over ``limit``" then). This fallback lists them (SCAN in Redis)."""
        return min(len(self.locks(prefix)), limit + 1)

    def clean_expired(self) -> int:
        """Remove expired locks; returns how many."""
        raise NotImplementedError

    def throttles(self, prefix: str = "jobguard:") -> list[ThrottleInfo]:
        """Current rate-limit windows and exception circuits (for the admin and the API)."""
        raise NotImplementedError

    def reset_throttle(self, key: str) -> bool:
        """Forget a rate-limit window or circuit (operators)."""
        raise NotImplementedError

    def now(self) -> datetime.datetime:
        """The store's clock."""
        raise NotImplementedError

    # -- counters: rate-limit windows and exception circuits (see stores/counters.py) --------
    # Each primitive is atomic across processes: one transaction with row locks (database) or
    # one Lua script (Redis). ``_at`` (store time in microseconds) is for the property tests.

    def hit_rate_limits(self, windows: Sequence[RateWindow], *,
                        _at: int | None = None) -> RateDecision:
        """Admit one start if every window has a slot and count it in all of them; otherwise
        count nothing (all-or-nothing) and say how long until all have a slot."""
        raise NotImplementedError

    def circuit_enter(self, key: str, *, owner: str, max_attempts: int, decay: float,
                      probe_lease: float, _at: int | None = None) -> CircuitDecision:
        """May a job on circuit ``key`` run now? Open → no; after the decay exactly one caller
        is admitted as the probe (``owner`` holds it for ``probe_lease`` seconds)."""
        raise NotImplementedError

    def circuit_leave(self, key: str, *, owner: str, outcome: str, max_attempts: int,
                      decay: float, _at: int | None = None) -> CircuitDecision:
        """Record a job's outcome on circuit ``key``: ``success`` (a real one: closes and
        resets), ``failure`` (counts; may open) or ``neutral`` (frees the probe if it was)."""
        raise NotImplementedError

    def clean_expired_throttles(self) -> int:
        """Remove rate windows and circuits that no longer hold anything; returns how many."""
        return 0


@dataclass(frozen=True)
class RateWindow:
    """One limit to check: at most ``limit`` starts in any ``decay`` seconds on ``key``."""

    key: str
    limit: int
    decay: float


@dataclass(frozen=True)
class RateDecision:
    """What :meth:`Store.hit_rate_limits` decided, at store time ``now``."""

    allowed: bool
    now: datetime.datetime
    retry_after: float = 0.0  # seconds until every blocking window has a slot
    blocked: tuple[str, ...] = ()  # keys of the windows that were full


@dataclass(frozen=True)
class CircuitDecision:
    """A circuit's state after :meth:`Store.circuit_enter` / :meth:`Store.circuit_leave`."""

    key: str
    state: str  # "closed", "open" or "half-open"
    failures: int
    admitted: bool = True
    probe: bool = False  # the caller is the half-open circuit's single probe
    retry_after: float = 0.0  # seconds until it is worth asking again (when not admitted)
    until: datetime.datetime | None = None  # window end / open until / probe lease end
