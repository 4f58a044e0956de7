"""Locks and throttles in any store (Redis included): listed with a "stale" verdict,
force-released, reset, cleaned."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass

from django.utils.module_loading import import_string

from django_jobguard import keys
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.models import QueuedJob
from django_jobguard.operations import audit
from django_jobguard.operations.workers import gone_reason, lease_holders
from django_jobguard.stores import LockInfo, Store, ThrottleInfo, get_store


class UnknownStoreError(LookupError):
    """A store alias that is not configured or cannot be used here."""


# -- stores --------------------------------------------------------------------------------


def usable_stores() -> list[str]:
    """Configured store aliases whose backend loads and whose configuration checks find no
    error (the built-in ``redis`` entry is left out when no django-redis cache backs it)."""
    aliases = []
    for alias, config in jobguard_settings.STORES.items():
        if not isinstance(config, dict) or "BACKEND" not in config:
            continue
        try:
            backend = import_string(config["BACKEND"])
        except ImportError:
            continue
        check = getattr(backend, "check_config", None)
        if check is not None and any(m.is_serious() for m in check(alias, config)):
            continue  # an error; a warning (e.g. W140, few sentinels) leaves it usable
        aliases.append(alias)
    default = jobguard_settings.STORE
    return sorted(aliases, key=lambda a: (a != default, a))


def store_for(alias: str | None) -> Store:
    """The store ``alias`` (default ``JOBGUARD['STORE']``) if it is usable here."""
    alias = alias or jobguard_settings.STORE
    known = usable_stores()
    if alias not in known:
        raise UnknownStoreError(f"Unknown store {alias!r}; configured stores: "
                                f"{', '.join(known) or 'none'}.")
    return get_store(alias)


# -- locks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockRow:
    """A lock as operators see it: the store's :class:`LockInfo` and a stale verdict."""

    info: LockInfo
    expires_in: float | None  # seconds, negative once expired; None = never expires
    stale: bool
    stale_reason: str

    @property
    def key(self) -> str:
        return self.info.key


def _job_uuid(job_id: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(job_id)
    except (ValueError, AttributeError, TypeError):
        return None

def inspect_locks(store: Store, *, using: str | None = None) -> list[LockRow]:
    """Every lock in ``store`` (expired ones too) with its stale verdict (all of them at
    once: ``jobs_locks``; pages use :func:`lock_page`).

    Stale means: expired; or its job is no longer queued; or (unique lock) its job is reserved
    by a worker without a recent heartbeat; or (overlap lock) its job is not running on a live
    worker, or runs again after a crash (reserved since the lock was taken). A lock without a
    job id is only judged by its expiry.
    """
    using = queue_database(using)
    return _judged(store, store.locks(include_expired=True), using)


#: The lock kinds a page can be narrowed to (the others are throttles).
LOCK_KINDS = ("unique", "overlap")


@dataclass(frozen=True)
class LockRowPage:
    """A page of locks with their stale verdicts, and the cursor of the next page."""

    rows: list[LockRow]
    cursor: str


def lock_page(store: Store, *, kind: str | None = None, prefix: str = "", cursor: str = "",
              limit: int = 100, using: str | None = None) -> LockRowPage:
    """About ``limit`` locks of ``kind`` (``unique``/``overlap``; ``None``: any) whose key
    starts with ``prefix``, from ``cursor``; one store read and one query for the verdicts,
    however many locks the store holds. ``prefix`` may leave out ``jobguard:<kind>:``."""
    using = queue_database(using)
    if kind is not None and kind not in LOCK_KINDS:
        raise ValueError(f"Unknown lock kind {kind!r}; expected one of {', '.join(LOCK_KINDS)}.")
    if not 1 <= limit <= 1000:
        raise ValueError(f"A page holds 1 to 1000 locks, not {limit}.")
    base = keys.prefix(kind)
    page = store.lock_page(prefix if prefix.startswith(base) else base + prefix,
                           cursor=cursor, limit=limit)
    return LockRowPage(_judged(store, page.locks, using), page.cursor)


def inspect_lock(store: Store, key: str, *, using: str | None = None) -> LockRow | None:
    """The held lock ``key`` with its stale verdict (one lookup), or ``None``."""
    using = queue_database(using)
    info = store.get_lock(key)
    return _judged(store, [info], using)[0] if info is not None else None


def _judged(store: Store, infos: list[LockInfo], using: str) -> list[LockRow]:
    """``infos`` with their stale verdicts: one query for their jobs, one for the workers."""
    now = store.now()
    ids = {u for u in (_job_uuid(i.job_id) for i in infos if i.job_id) if u}
    jobs = {str(row["id"]): row for row in QueuedJob.objects.using(using).filter(
        id__in=ids).with_state().values("id", "reserved_by", "reserved_at", "jobguard_state")}
    alive = lease_holders({row["reserved_by"] for row in jobs.values() if row["reserved_by"]},
                          using=using)
    rows = []
    for info in infos:
        expires_in = (info.expires_at - now).total_seconds() if info.expires_at else None
        reason = _stale_reason(info, expires_in, jobs, alive)
        rows.append(LockRow(info=info, expires_in=expires_in, stale=bool(reason),
                            stale_reason=reason))
    return rows


def _stale_reason(info: LockInfo, expires_in: float | None, jobs: dict, alive: set[str]) -> str:
    if expires_in is not None and expires_in <= 0:
        return "expired"
    if not info.job_id:
        return ""
    job = jobs.get(str(_job_uuid(info.job_id)))
    if job is None:
        return "its job is no longer queued"
    running = job["jobguard_state"] == "reserved"
    if running and gone_reason(job["reserved_by"], alive):
        return gone_reason(job["reserved_by"], alive)
    if info.kind != "unique" and not running:
        return "its job is not running"
    if (info.kind == "overlap" and info.acquired_at and job["reserved_at"]
            and job["reserved_at"] > info.acquired_at + _CLOCK_SLACK):
        return "its job was taken again since the lock was acquired"
    return ""


# A Redis store's clock and the database's may differ a little.
_CLOCK_SLACK = datetime.timedelta(seconds=1)


def force_release(store: Store, key: str, *, actor: str = "") -> bool:
    """Free lock ``key`` whoever holds it; False if it was not held."""
    released = store.force_release(key)
    if released:
        audit.record("force_release", 1, f"Lock {key} in store {store.alias} force-released",
                     actor)
    return released


def clean_locks(store: Store, *, actor: str = "") -> int:
    """Remove the expired locks of ``store``; returns how many."""
    removed = store.clean_expired()
    if removed:
        audit.record("clean_locks", removed, f"Removed {removed} expired lock(s) from store "
                     f"{store.alias}", actor)
    return removed


# -- throttles -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ThrottleRow:
    """A rate-limit window or circuit with the seconds until it resets (None = no end)."""

    info: ThrottleInfo
    resets_in: float | None

    @property
    def key(self) -> str:
        return self.info.key


def inspect_throttles(store: Store) -> list[ThrottleRow]:
    """Windows and circuits in ``store``; ``NotImplementedError`` if the store cannot list."""
    infos = store.throttles()
    now = store.now()
    return [ThrottleRow(info=info, resets_in=max((info.resets_at - now).total_seconds(), 0.0)
                        if info.resets_at else None)
            for info in sorted(infos, key=lambda i: (i.kind, i.key))]


def reset_throttle(store: Store, key: str, *, actor: str = "") -> bool:
    """Forget rate window or circuit ``key``; False if it had no state."""
    reset = store.reset_throttle(key)
    if reset:
        audit.record("reset_throttle", 1, f"Throttle {key} in store {store.alias} reset",
                     actor)
    return reset

