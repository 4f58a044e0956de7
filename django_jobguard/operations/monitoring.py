"""Stats and the monitor: per-queue counts (the states of the model), live workers, jobs done
in the last minute, thresholds; and the dashboard's overview (counts that stay fast on a
queue of a million rows, workers, locks and circuits, the per-minute history)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import Count, Min, Q, Sum, Value
from django.db.models.functions import Now, Trunc

from django_jobguard.conf import queue_database
from django_jobguard.dialects import dialect_for
from django_jobguard.history import current_minute
from django_jobguard.models import STATES, FailedJob, PausedQueue, QueuedJob, QueueMinute, Worker
from django_jobguard.operations.locks import usable_stores
from django_jobguard.operations.workers import heartbeat_grace, live_workers
from django_jobguard.stores import get_store


def _empty() -> dict[str, Any]:
    return dict.fromkeys((*STATES, "failed"), 0)


def queue_stats(*, using: str | None = None) -> dict[str, dict[str, int]]:
    """Per queue: ``waiting``, ``delayed``, ``reserved`` and ``failed`` counts (two queries)."""
    using = queue_database(using)
    out = {name: {**_empty(), **counts}
           for name, counts in QueuedJob.objects.using(using).state_counts().items()}
    for row in FailedJob.objects.using(using).order_by().values("queue").annotate(
            n=Count("id")):
        out.setdefault(row["queue"], _empty())["failed"] = row["n"]
    return out


def stats(*, using: str | None = None) -> dict:
    """Per-queue counts plus live workers and the jobs done and failed in the last minute.

    The last-minute numbers are the sums that live workers wrote at their latest heartbeat
    (each worker counts its own outcomes of the 60 s before it), so they lag by at most one
    heartbeat interval and leave out workers that have exited.
    """
    using = queue_database(using)
    live = Worker.objects.using(using).filter(last_seen_at__gte=Now() - Value(heartbeat_grace()))
    totals = live.aggregate(workers=Count("id"), done=Sum("done_last_minute"),
                            failed=Sum("failed_last_minute"))
    return {
        "queues": queue_stats(using=using),
        "workers": totals["workers"] or 0,
        "done_last_minute": totals["done"] or 0,
        "failed_last_minute": totals["failed"] or 0,
    }


@dataclass(frozen=True)
class QueueHealth:
    """One queue's counts against its threshold; ``size`` is waiting + delayed + reserved."""

    queue: str
    size: int
    waiting: int
    delayed: int
    reserved: int
    failed: int
    max: int
    status: str  # "OK" or "ALERT" (size reached max)
    unserved: bool = False  # jobs wait and no live worker serves the queue (nor '*')
    paused: bool = False  # workers claim none of its jobs until it is resumed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MonitorReport:
    queues: list[QueueHealth]

    @property
    def alerts(self) -> list[str]:
        """The queues at or over their threshold."""
        return [health.queue for health in self.queues if health.status == "ALERT"]

    @property
    def unserved(self) -> list[str]:
        """The queues with waiting jobs that no live worker serves."""
        return [health.queue for health in self.queues if health.unserved]


def monitor(thresholds: Mapping[str, int] | None = None, *, default_max: int = 1000,
            using: str | None = None) -> MonitorReport:
    """Each queue of ``thresholds`` (or every queue with jobs or paused, at ``default_max``)
    with an ALERT when its size reaches its maximum, flagged ``paused``, and ``unserved`` when
    jobs wait and no live worker serves it (a paused queue is not flagged)."""
    using = queue_database(using)
    thresholds = thresholds or {}
    counts = queue_stats(using=using)
    paused = set(PausedQueue.objects.using(using).values_list("queue", flat=True))
    lonely = set(unserved(counts, worker_rows(using=using), paused))
    report = []
    for name in list(thresholds) or sorted({*counts, *paused}):
        c = counts.get(name) or _empty()
        size = c["waiting"] + c["delayed"] + c["reserved"]
        limit = thresholds.get(name, default_max)
        report.append(QueueHealth(queue=name, size=size, waiting=c["waiting"],
                                  delayed=c["delayed"], reserved=c["reserved"],
                                  failed=c["failed"], max=limit,
                                  status="ALERT" if size >= limit else "OK",
                                  unserved=name in lonely, paused=name in paused))
    return MonitorReport(queues=report)


# -- the dashboard: counts that stay fast on a large queue, workers, stores, history --------

#: Up to this many jobs a state is counted exactly; above it PostgreSQL's planner estimate is
#: shown (marked ``estimated``), so a queue of a million rows costs a few index lookups.
EXACT_UP_TO = 10_000


def _priorities(rows, queue: str) -> list[int]:
    """The priorities present in ``queue``, highest first (one index descent each)."""
    found: list[int] = []
    head = rows.filter(queue=queue)
    while True:
        below = head.filter(priority__lt=found[-1]) if found else head
        priority = below.order_by("-priority").values_list("priority", flat=True).first()
        if priority is None:
            return found
        found.append(priority)


def _count(rows, using: str, exact_up_to: int) -> tuple[int, bool]:
    """:func:`count_or_estimate` of queued rows (the LIMITed count reads the claim index's
    ``available_at``: an index-only range)."""
    return count_or_estimate(rows, exact_up_to=exact_up_to, using=using,
                             column="available_at")


def count_or_estimate(rows, *, exact_up_to: int = EXACT_UP_TO, using: str | None = None,
                      column: str = "pk") -> tuple[int, bool]:
    """``(count, estimated)`` of the queryset ``rows``: exact up to ``exact_up_to`` (a
    LIMITed count of ``column``), else PostgreSQL's planner estimate (never below the limit)
    or, elsewhere, an exact count. What the dashboard's queue counts and the admin's
    history list (:class:`~django_jobguard.admin.base.EstimatedCountPaginator`) show."""
    using = using or rows.db
    counted = rows.order_by().values_list(column)[:exact_up_to + 1].count()
    if counted <= exact_up_to:
        return counted, False
    return _over_limit(rows.order_by(), using, exact_up_to)


def _over_limit(rows, using: str, exact_up_to: int) -> tuple[int, bool]:
    """The count of ``rows``, known to be over ``exact_up_to``: PostgreSQL's estimate
    (never below the limit), elsewhere an exact count."""
    estimate = dialect_for(using).estimate_rows(rows)
    if estimate is None:
        return rows.count(), False
    return max(estimate, exact_up_to + 1), True


def queue_overview(*, exact_up_to: int = EXACT_UP_TO,
                   using: str | None = None) -> dict[str, dict[str, Any]]:
    """Per queue: ``waiting``, ``delayed``, ``reserved`` (exact up to ``exact_up_to``, then
    estimated on PostgreSQL: ``estimated`` says so), ``failed`` (failed jobs kept),
    ``oldest_waiting_at`` (when the longest-waiting job became due; ``None``: none waits)
    and ``oldest_waiting_seconds``.

    Every query is a range of the claim index ``(queue, -priority, available_at)``, one per
    queue and priority present, so the cost follows the number of queues, not of rows.
    """
    using = queue_database(using)
    dialect = dialect_for(using)
    now = dialect.now()
    rows = QueuedJob.objects.using(using).order_by()
    out: dict[str, dict[str, Any]] = {}
    for name in dialect.queue_names():
        counts = {**_empty(), "estimated": False, "oldest_waiting_at": None}
        over_limit = False
        for priority in _priorities(rows, name):
            level = rows.filter(queue=name, priority=priority)
            # Waiting: the first ``exact_up_to + 1`` rows of the range, in index order, give
            # the count (if under the limit) and the oldest in one query.
            due = level.filter(available_at__lte=now).order_by("available_at")
            head = due.values_list("available_at")[:exact_up_to + 1].aggregate(
                n=Count("available_at"), oldest=Min("available_at"))
            over_limit |= head["n"] > exact_up_to  # counted for the whole queue, below
            counts["waiting"] += head["n"]
            oldest = head["oldest"]
            if oldest is not None and (counts["oldest_waiting_at"] is None
                                       or oldest < counts["oldest_waiting_at"]):
                counts["oldest_waiting_at"] = oldest
            # Delayed and reserved: the rows due later (few, usually), in one query.
            later = level.filter(available_at__gt=now)
            split = later.values_list("reserved_at")[:exact_up_to + 1].aggregate(
                delayed=Count("available_at", filter=Q(reserved_at__isnull=True)),
                reserved=Count("available_at", filter=Q(reserved_at__isnull=False)))
            if split["delayed"] + split["reserved"] > exact_up_to:
                for state, subset in (("delayed", later.filter(reserved_at__isnull=True)),
                                      ("reserved", later.filter(reserved_at__isnull=False))):
                    split[state], estimated = _count(subset, using, exact_up_to)
                    counts["estimated"] |= estimated
            counts["delayed"] += split["delayed"]
            counts["reserved"] += split["reserved"]
        if over_limit:  # one estimate for the queue errs less than a sum of several
            due = rows.filter(queue=name, available_at__lte=now)
            whole = dialect.estimate_rows(due)
            if whole is None:
                counts["waiting"] = due.count()
            else:
                counts["waiting"] = max(whole, exact_up_to + 1)
                counts["estimated"] = True
        out[name] = counts
    for row in FailedJob.objects.using(using).order_by().values("queue").annotate(
            n=Count("id")):
        out.setdefault(row["queue"], {**_empty(), "estimated": False,
                                      "oldest_waiting_at": None})["failed"] = row["n"]
    for counts in out.values():
        oldest = counts["oldest_waiting_at"]
        counts["oldest_waiting_seconds"] = (
            max((now - oldest).total_seconds(), 0.0) if oldest is not None else None)
    return out


def worker_rows(*, using: str | None = None) -> list[dict[str, Any]]:
    """The live workers (a heartbeat within ``RETRY_AFTER``; on this host, a live process):
    id, host, pid, ``queues`` as a list, current job, last heartbeat, jobs processed."""
    using = queue_database(using)
    now = dialect_for(using).now()
    rows = list(Worker.objects.using(using).filter(
        last_seen_at__gte=Now() - Value(heartbeat_grace())).order_by("id"))
    alive = live_workers([row.id for row in rows], using=using)
    return [{"id": row.id, "hostname": row.hostname, "pid": row.pid,
             "queues": [q for q in row.queues.split(",") if q],
             "current_job": row.current_job, "last_seen_at": row.last_seen_at,
             "seconds_since_heartbeat": max((now - row.last_seen_at).total_seconds(), 0.0),
             "jobs_processed": row.jobs_processed} for row in rows if row.id in alive]


def unserved(queues: Mapping[str, Mapping[str, Any]], workers: list[dict[str, Any]],
             paused: set[str]) -> list[str]:
    """Queues with waiting jobs that no live worker serves (``'*'`` serves every queue); a
    paused queue is left out (nobody is meant to serve it)."""
    served = {name for worker in workers for name in worker["queues"]}
    if "*" in served:
        return []
    return sorted(name for name, counts in queues.items()
                  if counts["waiting"] and name not in served and name not in paused)


def store_summaries(*, limit: int = EXACT_UP_TO) -> list[dict[str, Any]]:
    """Per usable store: ``held_locks`` (exact up to ``limit``, then ``limit + 1``),
    ``open_circuits`` (open or half-open), or ``error`` when the store cannot be read."""
    out = []
    for alias in usable_stores():
        entry: dict[str, Any] = {"store": alias, "held_locks": None, "open_circuits": None,
                                 "error": ""}
        try:
            store = get_store(alias)
            entry["held_locks"] = store.count_locks(limit=limit)
            entry["open_circuits"] = sum(1 for t in store.throttles()
                                         if t.kind == "circuit" and t.state != "closed")
        except NotImplementedError:
            entry["error"] = "this store cannot list locks or throttles"
        except Exception as exc:  # a store that is down must not take the dashboard with it
            entry["error"] = f"could not read the store: {exc}"
        out.append(entry)
    return out


def _series(by_queue: dict[str, list[list[int]]], start: datetime.datetime, step: int,
            minutes: list[int]) -> dict[str, Any]:
    """One chart's data: per queue, ``done`` / ``failed`` in jobs/min for each point (its
    count over the ``minutes`` it covers) and the window's totals."""
    return {"start": start, "step_minutes": step, "queues": {
        name: {"done": [round(n / m, 2) for n, m in zip(done, minutes, strict=True)],
               "failed": [round(n / m, 2) for n, m in zip(failed, minutes, strict=True)],
               "total_done": sum(done), "total_failed": sum(failed)}
        for name, (done, failed) in sorted(by_queue.items())}}


def history(*, using: str | None = None) -> dict[str, Any]:
    """Jobs per minute done and failed per queue, from the workers' per-minute counts
    (:mod:`django_jobguard.history`): ``1h`` has the last 60 minutes, one point each; ``24h``
    the last 24 clock hours (UTC), one point each, the current hour's rate over the minutes it
    has had. Each has ``start`` (its first point), ``step_minutes``, and per queue ``done`` /
    ``failed`` (jobs/min, oldest first) and the window's totals. Two small queries: 60 rows
    per queue, and 24 per queue grouped by the database."""
    using = queue_database(using)
    current = current_minute(using)
    rows = QueueMinute.objects.using(using).order_by()
    # The last hour, per minute.
    first = current - datetime.timedelta(minutes=59)
    minutes: dict[str, list[list[int]]] = {}
    for minute, name, done, failed in rows.filter(
            minute__gte=first, minute__lte=current).values_list(
            "minute", "queue", "done", "failed"):
        index = int((minute - first).total_seconds() // 60)
        slot = minutes.setdefault(name, [[0] * 60, [0] * 60])
        slot[0][index] += done
        slot[1][index] += failed
    # The last 24 clock hours, per hour, summed by the database.
    this_hour = current.replace(minute=0)
    first_hour = this_hour - datetime.timedelta(hours=23)
    hours: dict[str, list[list[int]]] = {}
    for row in rows.filter(minute__gte=first_hour, minute__lte=current).annotate(
            hour=Trunc("minute", "hour", tzinfo=datetime.UTC)).values("queue", "hour").annotate(
            n_done=Sum("done"), n_failed=Sum("failed")):
        index = int((row["hour"] - first_hour).total_seconds() // 3600)
        slot = hours.setdefault(row["queue"], [[0] * 24, [0] * 24])
        slot[0][index] += row["n_done"]
        slot[1][index] += row["n_failed"]
    return {"1h": _series(minutes, first, 1, [1] * 60),
            "24h": _series(hours, first_hour, 60, [60] * 23 + [current.minute + 1])}


def overview(*, using: str | None = None) -> dict[str, Any]:
    """Everything the dashboard and ``GET stats/history/`` show: per-queue counts with the
    failures of the last hour, paused and unserved flags; live workers; locks and circuits
    per store; the 1 h and 24 h history; and :func:`stats`' last-minute totals."""
    using = queue_database(using)
    queues = queue_overview(using=using)
    charts = history(using=using)
    last_hour = charts["1h"]["queues"]
    for name in last_hour:
        queues.setdefault(name, {**_empty(), "estimated": False, "oldest_waiting_at": None,
                                 "oldest_waiting_seconds": None})
    paused = {row.queue for row in PausedQueue.objects.using(using)}
    for name in paused:
        queues.setdefault(name, {**_empty(), "estimated": False, "oldest_waiting_at": None,
                                 "oldest_waiting_seconds": None})
    workers = worker_rows(using=using)
    lonely = set(unserved(queues, workers, paused))
    for name, counts in queues.items():
        counts["failed_last_hour"] = last_hour.get(name, {}).get("total_failed", 0)
        counts["done_last_hour"] = last_hour.get(name, {}).get("total_done", 0)
        counts["paused"] = name in paused
        counts["unserved"] = name in lonely
    totals = Worker.objects.using(using).filter(
        id__in=[w["id"] for w in workers]).aggregate(done=Sum("done_last_minute"),
                                                      failed=Sum("failed_last_minute"))
    return {
        "generated_at": dialect_for(using).now(),
        "queues": dict(sorted(queues.items())),
        "workers": workers,
        "done_last_minute": totals["done"] or 0,
        "failed_last_minute": totals["failed"] or 0,
        "stores": store_summaries(),
        "history": charts,
    }
