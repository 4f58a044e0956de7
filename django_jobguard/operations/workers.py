"""Which workers are alive: a recent heartbeat, and a live process when on this host."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Iterable

from django.db.models import Value
from django.db.models.functions import Now

from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.models import Worker

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


def live_workers(ids: Iterable[str], *, using: str | None = None) -> set[str]:
    """Workers among ``ids`` that sent a heartbeat within ``RETRY_AFTER`` seconds, less those
    on this host whose process is gone (a ``kill -9`` shows at once, not a heartbeat later)."""
    using = queue_database(using)
    here = socket.gethostname()
    return {worker_id for worker_id, hostname, pid in Worker.objects.using(using).filter(
        id__in=list(ids), last_seen_at__gte=Now() - Value(heartbeat_grace())
    ).values_list("id", "hostname", "pid") if hostname != here or _pid_alive(pid)}


def dead_workers(*, using: str | None = None):
    """Worker rows silent for ``DEAD_WORKER_AFTER_LEASES`` leases (the process is gone)."""
    using = queue_database(using)
    gone = Now() - Value(DEAD_WORKER_AFTER_LEASES * heartbeat_grace())
    return Worker.objects.using(using).filter(last_seen_at__lt=gone)
