"""What operators do, shared by the admin and the REST API.

Queued jobs: their state on the database clock, cancel (never a reserved job), run now.
Failed jobs: retry, forget. Locks and throttles: listed from any store, with a "stale" verdict
for locks whose expiry passed or whose job or worker is gone.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Case, CharField, Count, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Now
from django.utils.module_loading import import_string

from django_jobguard import queue, unique
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob, Worker
from django_jobguard.stores import LockInfo, Store, ThrottleInfo, get_store

logger = logging.getLogger("django_jobguard.operations")

STATES = ("waiting", "delayed", "reserved")


class UnknownStoreError(LookupError):
    """A store alias that is not configured or cannot be used here."""


# -- queued jobs ---------------------------------------------------------------------------


def state_q(state: str) -> Q:
    """Rows in ``state`` (``waiting``, ``delayed`` or ``reserved``), judged by the DB clock."""
    if state == "reserved":
        return Q(reserved_at__isnull=False, available_at__gt=Now())
    if state == "delayed":
        return Q(reserved_at__isnull=True, available_at__gt=Now())
    if state == "waiting":
        return Q(available_at__lte=Now())
    raise ValueError(f"Unknown state {state!r}; expected one of {', '.join(STATES)}.")


def with_state(qs: QuerySet[QueuedJob]) -> QuerySet[QueuedJob]:
    """Annotate ``jobguard_state`` (same rules as :func:`state_q`)."""
    return qs.annotate(jobguard_state=Case(
        When(state_q("reserved"), then=Value("reserved")),
        When(state_q("delayed"), then=Value("delayed")),
        default=Value("waiting"),
        output_field=CharField(),
    ))


def _not_reserved() -> Q:
    return Q(reserved_at__isnull=True) | Q(available_at__lte=Now())


@dataclass
class CancelResult:
    cancelled: list[str]
    reserved: list[str]


def cancel(jobs: Iterable[QueuedJob], *, using: str = DEFAULT_DB_ALIAS) -> CancelResult:
    """Delete jobs that no worker holds and free their unique locks; reserved ones stay.

    Each delete re-checks the state in SQL, so a job a worker claims meanwhile is not deleted.
    """
    result = CancelResult(cancelled=[], reserved=[])
    for row in jobs:
        deleted = QueuedJob.objects.using(using).filter(_not_reserved(), id=row.id)._raw_delete(
            using)
        if deleted:
            unique.release(row.payload)
            result.cancelled.append(str(row.id))
        else:
            result.reserved.append(str(row.id))
    return result


def run_now(qs: QuerySet[QueuedJob]) -> int:
    """Make delayed jobs due at once; reserved jobs are left to their worker."""
    return qs.filter(_not_reserved()).update(available_at=Now())


# -- failed jobs ---------------------------------------------------------------------------


def retry(failed: Iterable[FailedJob], *, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Queue failed jobs again with fresh attempts and remove them from failed jobs."""
    return queue.retry_failed(list(failed), using=using)


def forget(qs: QuerySet[FailedJob]) -> int:
    return qs.delete()[0]


# -- stores --------------------------------------------------------------------------------


def usable_stores() -> list[str]:
    """Configured store aliases whose backend loads and whose configuration checks pass
    (the built-in ``redis`` entry is left out when no django-redis cache backs it)."""
    aliases = []
    for alias, config in jobguard_settings.STORES.items():
        if not isinstance(config, dict) or "BACKEND" not in config:
            continue
        try:
            backend = import_string(config["BACKEND"])
        except ImportError:
            continue
        check = getattr(backend, "check_config", None)
        if check is not None and check(alias, config):
            continue
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


def live_workers(ids: Iterable[str], *, using: str = DEFAULT_DB_ALIAS) -> set[str]:
    """Workers among ``ids`` that sent a heartbeat within ``RETRY_AFTER`` seconds."""
    grace = datetime.timedelta(seconds=float(jobguard_settings.RETRY_AFTER))
    return set(Worker.objects.using(using).filter(
        id__in=list(ids), last_seen_at__gte=Now() - Value(grace)
    ).values_list("id", flat=True))


def inspect_locks(store: Store, *, using: str = DEFAULT_DB_ALIAS) -> list[LockRow]:
    """Every lock in ``store`` (expired ones too) with its stale verdict.

    Stale means: expired; or its job is no longer queued; or (unique lock) its job is reserved
    by a worker without a recent heartbeat; or (overlap lock) its job is not running on a live
    worker. A lock without a job id is only judged by its expiry.
    """
    infos = store.locks(include_expired=True)
    now = store.now()
    ids = {u for u in (_job_uuid(i.job_id) for i in infos if i.job_id) if u}
    jobs = {str(row["id"]): row for row in with_state(
        QueuedJob.objects.using(using).filter(id__in=ids)).values(
        "id", "reserved_by", "jobguard_state")}
    alive = live_workers({row["reserved_by"] for row in jobs.values() if row["reserved_by"]},
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
    if running and job["reserved_by"] not in alive:
        return f"worker {job['reserved_by']} is gone"
    if info.kind != "unique" and not running:
        return "its job is not running"
    return ""


def force_release(store: Store, key: str, *, actor: str = "") -> bool:
    released = store.force_release(key)
    if released:
        logger.warning("Lock %s in store %s force-released by %s.", key, store.alias,
                       actor or "an operator")
    return released


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
    reset = store.reset_throttle(key)
    if reset:
        logger.warning("Throttle %s in store %s reset by %s.", key, store.alias,
                       actor or "an operator")
    return reset


# -- stats ---------------------------------------------------------------------------------


def stats(*, using: str = DEFAULT_DB_ALIAS) -> dict:
    """Per-queue counts plus jobs done and failed in the last minute.

    The last-minute numbers are the sums that live workers wrote at their latest heartbeat
    (each worker counts its own outcomes of the 60 s before it), so they lag by at most one
    heartbeat interval and leave out workers that have exited.
    """
    grace = datetime.timedelta(seconds=float(jobguard_settings.RETRY_AFTER))
    live = Worker.objects.using(using).filter(last_seen_at__gte=Now() - Value(grace))
    totals = live.aggregate(workers=Count("id"), done=Sum("done_last_minute"),
                            failed=Sum("failed_last_minute"))
    return {
        "queues": queue.stats(using=using),
        "workers": totals["workers"] or 0,
        "done_last_minute": totals["done"] or 0,
        "failed_last_minute": totals["failed"] or 0,
    }
