"""Gauges read from the database (and the lock stores) at scrape time.

One scrape describes the whole system, whichever process serves it, so several web
processes behind a load balancer all answer the same. Cost per scrape: the two queries of
:func:`~django_jobguard.operations.monitoring.queue_stats` (the counts the admin and
``jobs_monitor`` show), one for the oldest waiting job per queue, one for live workers,
and a listing of the held locks and the circuits of each usable store (SCAN on Redis). A
store that cannot be read is reported as ``jobguard_store_up{store} 0`` and its lock and
circuit gauges are left out, instead of failing the scrape.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

from django.db.models import Min, Value
from django.db.models.functions import Now
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from django_jobguard import clock, slo
from django_jobguard.conf import queue_database
from django_jobguard.models import STATES, QueuedJob, Worker
from django_jobguard.operations.locks import usable_stores
from django_jobguard.operations.monitoring import queue_stats, unserved, worker_rows
from django_jobguard.operations.workers import heartbeat_grace
from django_jobguard.stores import get_store

logger = logging.getLogger("django_jobguard.metrics")


class DatabaseCollector(Collector):
    """``jobguard_queue_jobs{queue,state}``, ``jobguard_queue_oldest_waiting_seconds{queue}``,
    ``jobguard_failed_jobs{queue}``, ``jobguard_workers``, ``jobguard_locks_held{store,
    kind}``, ``jobguard_circuits_open{store}`` and ``jobguard_store_up{store}``; per queue
    ``jobguard_queue_latency_seconds``, ``_paused``, ``_unserved``,
    ``_recommended_workers``, ``_throughput``, ``_failure_rate`` and
    ``jobguard_queue_slo_breached{queue,slo}`` (:mod:`django_jobguard.slo`)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = queue_database(using)

    def collect(self) -> Iterator[Any]:
        yield from self._queues()
        yield from self._objectives()
        live = Worker.objects.using(self.using).filter(
            last_seen_at__gte=Now() - Value(heartbeat_grace())).count()
        yield GaugeMetricFamily("jobguard_workers", "Workers whose heartbeat is recent.",
                                value=live)
        yield from self._stores()

    def _queues(self) -> Iterator[Any]:
        jobs = GaugeMetricFamily("jobguard_queue_jobs",
                                 "Queued jobs by state: waiting (due now: the queue's depth), "
                                 "delayed, reserved (a worker holds it).",
                                 labels=["queue", "state"])
        failed = GaugeMetricFamily("jobguard_failed_jobs", "Failed jobs kept, by queue.",
                                   labels=["queue"])
        for name, counts in sorted(queue_stats(using=self.using).items()):
            for state in STATES:
                jobs.add_metric([name, state], counts[state])
            failed.add_metric([name], counts["failed"])
        yield jobs
        yield failed
        oldest = GaugeMetricFamily(
            "jobguard_queue_oldest_waiting_seconds",
            "How long the longest-waiting due job of the queue has been due (0: none).",
            labels=["queue"])
        now = clock.now()
        rows = (QueuedJob.objects.using(self.using).waiting().order_by().values("queue")
                .annotate(since=Min("available_at")))
        for row in sorted(rows, key=lambda r: r["queue"]):
            oldest.add_metric([row["queue"]], max((now - row["since"]).total_seconds(), 0.0))
        yield oldest

    def _objectives(self) -> Iterator[Any]:
        """The autoscaling signal and the objectives (:mod:`django_jobguard.slo`)."""
        loads = slo.measure(using=self.using)
        families = {
            "latency": GaugeMetricFamily(
                "jobguard_queue_latency_seconds",
                "Seconds the oldest waiting (due, unclaimed) job of the queue has waited.",
                labels=["queue"]),
            "paused": GaugeMetricFamily("jobguard_queue_paused", "1 if the queue is paused.",
                                        labels=["queue"]),
            "unserved": GaugeMetricFamily(
                "jobguard_queue_unserved",
                "1 if jobs wait on the queue and no live worker serves it (not paused).",
                labels=["queue"]),
            "recommended": GaugeMetricFamily(
                "jobguard_queue_recommended_workers",
                "Workers the queue needs (Little's law: throughput x mean runtime, plus "
                "draining the backlog within max_wait, / worker_concurrency).",
                labels=["queue"]),
            "throughput": GaugeMetricFamily(
                "jobguard_queue_throughput", "Jobs per second finished over SLO_WINDOW.",
                labels=["queue"]),
            "failure_rate": GaugeMetricFamily(
                "jobguard_queue_failure_rate",
                "Share of the runs finished over SLO_WINDOW that failed (queues with runs).",
                labels=["queue"]),
            "breached": GaugeMetricFamily(
                "jobguard_queue_slo_breached",
                "1 while the queue's objective (max_wait, max_failure_rate) is breached.",
                labels=["queue", "slo"]),
        }
        lonely = set(unserved({name: {"waiting": load.waiting} for name, load in loads.items()},
                              worker_rows(using=self.using),
                              {name for name, load in loads.items() if load.paused}))
        targets = slo.objectives()
        for name, load in loads.items():
            families["latency"].add_metric([name], load.latency)
            families["paused"].add_metric([name], int(load.paused))
            families["unserved"].add_metric([name], int(name in lonely))
            families["recommended"].add_metric([name], load.recommended_workers)
            families["throughput"].add_metric([name], load.throughput)
            if load.failure_rate is not None:
                families["failure_rate"].add_metric([name], load.failure_rate)
            for objective in targets.get(name, {}):
                families["breached"].add_metric([name, objective],
                                                int(objective in load.breached))
        yield from families.values()

    def _stores(self) -> Iterator[Any]:
        up = GaugeMetricFamily("jobguard_store_up",
                               "1 if the lock store could be read at this scrape.",
                               labels=["store"])
        locks = GaugeMetricFamily("jobguard_locks_held",
                                  "Locks held (not expired), by kind: unique, overlap, …",
                                  labels=["store", "kind"])
        circuits = GaugeMetricFamily("jobguard_circuits_open",
                                     "Exception circuits (ThrottlesExceptions) open now.",
                                     labels=["store"])
        for alias in usable_stores():
            try:
                store = get_store(alias)
                kinds = Counter(info.kind for info in store.locks())
                open_circuits = sum(1 for t in store.throttles()
                                    if t.kind == "circuit" and t.state == "open")
            except Exception as exc:
                logger.warning("Metrics: store %r could not be read (%s).", alias, exc)
                up.add_metric([alias], 0)
                continue
            up.add_metric([alias], 1)
            for kind in sorted({"unique", "overlap"} | set(kinds)):
                locks.add_metric([alias, kind], kinds.get(kind, 0))
            circuits.add_metric([alias], open_circuits)
        yield up
        yield locks
        yield circuits
