"""Which workers are alive (a recent heartbeat, and a live process when on this host), and
what operators ask of them: quiet (claim nothing new) and stop (a graceful stop)."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Iterable

from django.db.models import BooleanField, Case, Value, When
from django.db.models.functions import Now

from django_jobguard import registry
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.models import QUIET, STOP, WORKER_COMMANDS, QueuedJob, Worker
from django_jobguard.operations import audit

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


class WorkerNotFound(LookupError):
    """No worker row has the id (it stopped, or never was)."""


class WorkerGoneError(RuntimeError):
    """The worker's row is there but the worker is not alive: nothing would read a command."""


def command_worker(worker_id: str, command: str, *, actor: str = "",
                   using: str | None = None) -> str:
    """Ask the live worker ``worker_id`` to ``quiet`` (claim nothing new; its running jobs
    finish) or ``stop`` (a graceful stop: its running jobs finish, it exits 0). Written to
    that worker's own row, which its heartbeat reads (within one beat, on any host). Returns
    the command the worker now has: ``stop`` stays ``stop`` when asked to quiet afterwards.

    Owner-checked: the command goes to one worker, by its id (``host:pid:token``, unique
    per process), only while it is alive (:func:`worker_states`), so a command for a worker
    that is gone reaches no other process. :class:`WorkerNotFound` without a row,
    :class:`WorkerGoneError` for a row whose worker is gone."""
    using = queue_database(using)
    if command not in WORKER_COMMANDS:
        raise ValueError(f"Unknown worker command {command!r}; expected one of "
                         f"{', '.join(WORKER_COMMANDS)}.")
    state = worker_states([worker_id], using=using).get(worker_id, UNKNOWN)
    rows = Worker.objects.using(using).filter(id=worker_id)
    if state == UNKNOWN or not rows.exists():
        raise WorkerNotFound(f"No worker {worker_id!r} (it has stopped, or never ran).")
    if state != ALIVE:
        raise WorkerGoneError(f"Worker {worker_id} is gone ({state}): nothing would "
                              f"{command} it.")
    if command == QUIET:
        rows = rows.exclude(command=STOP)  # a quiet does not take back a stop
    if rows.update(command=command, command_by=actor[:150], command_at=Now()):
        audit.record(f"worker_{command}", 1, f"{'Quieted' if command == QUIET else 'Stopped'} "
                     f"worker {worker_id}", actor)
        return command
    return STOP


def running_jobs(workers: list[Worker], *, using: str | None = None) -> dict[str, str]:
    """``{job id: the job's name as operators know it}`` for the jobs ``workers`` run now
    (one query; a job that finished meanwhile is left out)."""
    ids = {job_id for worker in workers for job_id in worker.current_job.split(",") if job_id}
    if not ids:
        return {}
    rows = QueuedJob.objects.using(queue_database(using))
    adapters = registry.display_paths()
    found: dict[str, str] = {}
    for row_id, name in rows.filter(id__in=list(ids)).values_list("id", "name"):
        if name in adapters:  # a django.tasks task: its own dotted name, from the payload
            payload = rows.filter(id=row_id).values_list("payload", flat=True).first()
            name = registry.display_name(name, payload)
        found[str(row_id)] = name
    return found
