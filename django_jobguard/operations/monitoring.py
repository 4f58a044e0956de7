"""Stats and the monitor: per-queue counts (the states of the model), live workers, jobs done
in the last minute, thresholds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import Count, Sum, Value
from django.db.models.functions import Now

from django_jobguard.conf import queue_database
from django_jobguard.models import STATES, FailedJob, QueuedJob, Worker
from django_jobguard.operations.workers import heartbeat_grace


def _empty() -> dict[str, int]:
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MonitorReport:
    queues: list[QueueHealth]

    @property
    def alerts(self) -> list[str]:
        """The queues at or over their threshold."""
        return [health.queue for health in self.queues if health.status == "ALERT"]


def monitor(thresholds: Mapping[str, int] | None = None, *, default_max: int = 1000,
            using: str | None = None) -> MonitorReport:
    """Each queue of ``thresholds`` (or every queue with jobs, at ``default_max``) with an
    ALERT when its size reaches its maximum."""
    using = queue_database(using)
    thresholds = thresholds or {}
    counts = queue_stats(using=using)
    report = []
    for name in list(thresholds) or sorted(counts):
        c = counts.get(name) or _empty()
        size = c["waiting"] + c["delayed"] + c["reserved"]
        limit = thresholds.get(name, default_max)
        report.append(QueueHealth(queue=name, size=size, waiting=c["waiting"],
                                  delayed=c["delayed"], reserved=c["reserved"],
                                  failed=c["failed"], max=limit,
                                  status="ALERT" if size >= limit else "OK"))
    return MonitorReport(queues=report)
