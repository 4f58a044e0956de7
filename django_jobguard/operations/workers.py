"""Which workers are alive: a recent heartbeat, and a live process when on this host."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Iterable

from django.db.models import BooleanField, Case, Value, When
from django.db.models.functions import Now

from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.models import QueuedJob, Worker

#: A worker row whose last heartbeat is older than this many ``RETRY_AFTER`` is deleted.
DEAD_WORKER_AFTER_LEASES = 10


def heartbeat_grace() -> datetime.timedelta:
    """A worker without a heartbeat for this long (``RETRY_AFTER``) no longer counts."""
    return datetime.timedelta(seconds=float(jobguard_settings.RETRY_AFTER))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


#: What :func:`worker_states` says of a worker: it beats (and runs, when on this host); its
#: process on this host has ended (told by its row, or by its id when it has none); its
#: heartbeat is older than ``RETRY_AFTER``; no row (deleted by housekeeping or by hand: a
#: live worker registers again at its next heartbeat).
ALIVE, ENDED, SILENT, UNKNOWN = "alive", "ended", "silent", "unknown"


def worker_states(ids: Iterable[str], *, using: str | None = None) -> dict[str, str]:
    """Each of the workers ``ids``: :data:`ALIVE`, :data:`ENDED` (a ``kill -9`` on this host
    shows at once, not a heartbeat later), :data:`SILENT` or :data:`UNKNOWN` (one query)."""
    using = queue_database(using)
    ids = {i for i in ids if i}
    here = socket.gethostname()
    states = dict.fromkeys(ids, UNKNOWN)
    for worker_id in ids:  # no row: a worker id is ``host:pid:…``, its process may be known
        host, _, rest = worker_id.partition(":")
        pid_text = rest.partition(":")[0]
        if host == here and pid_text.isdigit() and not _pid_alive(int(pid_text)):
            states[worker_id] = ENDED
    for worker_id, hostname, pid, fresh in Worker.objects.using(using).filter(
            id__in=list(ids)).annotate(fresh=Case(
                When(last_seen_at__gte=Now() - Value(heartbeat_grace()), then=Value(True)),
                default=Value(False), output_field=BooleanField())).values_list(
            "id", "hostname", "pid", "fresh"):
        if hostname == here and not _pid_alive(pid):
            states[worker_id] = ENDED
        else:
            states[worker_id] = ALIVE if fresh else SILENT
    return states


def live_workers(ids: Iterable[str], *, using: str | None = None) -> set[str]:
    """Workers among ``ids`` that sent a heartbeat within ``RETRY_AFTER`` seconds, less those
    on this host whose process is gone (a ``kill -9`` shows at once, not a heartbeat later)."""
    return {worker_id for worker_id, state in worker_states(ids, using=using).items()
            if state == ALIVE}


def lease_holders(ids: Iterable[str], *, using: str | None = None) -> set[str]:
    """Workers among ``ids`` that still hold the jobs they reserved with a fresh lease:
    :data:`ALIVE` ones, and :data:`UNKNOWN` ones, which have no row (housekeeping deleted it
    while the process was stopped, or an operator did) but renewed that lease within
    ``RETRY_AFTER``; a live worker writes its row again at its next heartbeat."""
    return {worker_id for worker_id, state in worker_states(ids, using=using).items()
            if state in (ALIVE, UNKNOWN)}


def gone_reason(worker_id: str, alive: set[str]) -> str:
    """The stale verdict of a reservation (or lock) held by ``worker_id``: ``worker … is
    gone`` unless it is among ``alive`` (from :func:`lease_holders` or :func:`live_workers`);
    empty otherwise."""
    return "" if worker_id in alive else f"worker {worker_id} is gone"


def stale_reservations(rows: Iterable[QueuedJob], *, using: str | None = None
                       ) -> dict[str, str]:
    """``{job id: reason}`` for the rows reserved by a worker that is gone (one query for
    the workers); rows that are not reserved, or whose worker lives, are left out. The
    verdict is the locks page's (:func:`gone_reason`)."""
    held = [row for row in rows if row.reserved_at is not None and row.reserved_by
            and row.state == "reserved"]
    alive = lease_holders({row.reserved_by for row in held}, using=using)
    verdicts = {str(row.id): gone_reason(row.reserved_by, alive) for row in held}
    return {job_id: reason for job_id, reason in verdicts.items() if reason}


def dead_workers(*, using: str | None = None):
    """Worker rows silent for ``DEAD_WORKER_AFTER_LEASES`` leases (the process is gone)."""
    using = queue_database(using)
    gone = Now() - Value(DEAD_WORKER_AFTER_LEASES * heartbeat_grace())
    return Worker.objects.using(using).filter(last_seen_at__lt=gone)
