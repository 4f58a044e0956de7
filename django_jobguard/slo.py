"""Queue latency objectives and the autoscaling signal.

Per queue, ``JOBGUARD["QUEUES"]`` may set two objectives::

    "QUEUES": {"emails": {"max_wait": 30, "max_failure_rate": 0.05, "worker_concurrency": 4}}

- ``max_wait``: seconds the oldest waiting (due, unclaimed) job may have waited;
- ``max_failure_rate``: the share of the runs finished in the last ``SLO_WINDOW`` seconds that
  failed for good (judged once at least ``SLO_MIN_RUNS`` ran).

**Evaluation.** Every worker's heartbeat calls :func:`check` (only when some queue has an
objective): it measures each queue (:func:`measure`) and compares. An objective is
*breached* when its value goes above the threshold and *recovers* when it falls to
``SLO_RECOVERY`` times the threshold or below (hysteresis: a value hovering at the threshold
does not flap). Between the two, nothing changes.

**Once per crossing, across workers.** The state of each objective is a
:class:`~django_jobguard.models.QueueAlert` row. A worker that sees a crossing changes it with
one conditional ``UPDATE ... SET breached = true WHERE queue = q AND slo = s AND breached =
false``: the database lets exactly one of several workers that saw the same crossing update
the row (the others find it changed and update nothing), and only that worker sends
:data:`~django_jobguard.signals.queue_slo_breached` (or ``queue_slo_recovered``) and POSTs
the webhook (``SLO_WEBHOOK``). The POST runs in a background thread with a timeout
(``SLO_WEBHOOK_TIMEOUT``), so it never holds up a job or the heartbeat; a failure is logged,
not retried (the dashboard, the metrics and ``jobs_monitor`` show the state meanwhile).

**The autoscaling signal.** :func:`recommended_workers` applies Little's law: the worker
slots busy on a queue are its arrival rate times the mean runtime (L = λW). The measured
rate is the queue's throughput over ``SLO_WINDOW`` (the workers' per-minute counts, which the
dashboard's charts read; in a steady state arrivals equal completions); the mean runtime
comes from the finished-run history (``HISTORY = "all"``); without it, from the jobs running
now (L = λW, so W = L / λ). To that it adds the slots that drain the waiting backlog within
``max_wait`` (or :data:`DRAIN_SECONDS`), and divides by the queue's ``worker_concurrency``
(job slots per worker, default 1), rounding up; a queue with waiting jobs asks for at least
one worker, a paused queue for none. ``jobguard_queue_recommended_workers`` exports it for
an autoscaler (KEDA's Prometheus scaler: docs/operate.md).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import threading
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import Avg, Sum
from django.db.models.functions import Now

from django_jobguard import history, signals
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.models import FinishedRun, PausedQueue, QueueAlert, QueueMinute
from django_jobguard.operations import monitoring

logger = logging.getLogger("django_jobguard.slo")

#: The objectives a queue may set, in the order they are checked.
OBJECTIVES = ("max_wait", "max_failure_rate")
#: Seconds to drain a waiting backlog in, for a queue without ``max_wait``.
DRAIN_SECONDS = 60.0


@dataclass(frozen=True)
class QueueLoad:
    """What :func:`measure` found of one queue."""

    queue: str
    waiting: int
    reserved: int
    #: Seconds the oldest waiting job has waited (0: none waits).
    latency: float
    #: Runs finished (done) and failed for good in the window.
    done: int
    failed: int
    #: ``failed / (done + failed)`` in the window; None: no runs.
    failure_rate: float | None
    #: Jobs per second finished over the window.
    throughput: float
    #: Mean runtime (seconds) of the window's runs in the history; None: unknown.
    mean_runtime: float | None
    recommended_workers: int
    paused: bool
    #: The objectives breached now (``QueueAlert`` rows).
    breached: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "breached": list(self.breached)}


@dataclass(frozen=True)
class Crossing:
    """An objective that was breached or recovered (sent once, by one worker)."""

    queue: str
    slo: str
    breached: bool
    value: float
    threshold: float

    def payload(self) -> dict[str, Any]:
        """The webhook's JSON body."""
        return {"event": "breached" if self.breached else "recovered", "queue": self.queue,
                "slo": self.slo, "value": self.value, "threshold": self.threshold,
                "recovery_threshold": self.threshold * float(jobguard_settings.SLO_RECOVERY),
                "at": datetime.datetime.now(datetime.UTC).isoformat()}


def objectives() -> dict[str, dict[str, float]]:
    """``{queue: {"max_wait": 30, ...}}`` for every queue with at least one objective."""
    out: dict[str, dict[str, float]] = {}
    for name, config in (jobguard_settings.QUEUES or {}).items():
        if isinstance(config, dict):
            found = {key: float(config[key]) for key in OBJECTIVES if key in config}
            if found:
                out[name] = found
    return out


def worker_concurrency(queue: str) -> int:
    """Job slots per worker of ``queue`` (``QUEUES[queue]["worker_concurrency"]``, else 1)."""
    config = (jobguard_settings.QUEUES or {}).get(queue)
    return int(config.get("worker_concurrency", 1)) if isinstance(config, dict) else 1


def window() -> datetime.timedelta:
    """``SLO_WINDOW`` as whole minutes (the per-minute counts' resolution)."""
    return datetime.timedelta(minutes=max(math.ceil(float(jobguard_settings.SLO_WINDOW) / 60),
                                          1))


def recommended_workers(*, throughput: float, mean_runtime: float | None, waiting: int,
                        reserved: int, concurrency: int = 1,
                        drain_seconds: float = DRAIN_SECONDS, paused: bool = False) -> int:
    """Workers a queue needs (Little's law; see the module docstring): ``ceil((λ·W +
    waiting·W / drain_seconds) / concurrency)``. Without a measured mean runtime ``W`` the
    jobs running now (``reserved``, L) give it as L / λ; with no throughput either, they
    stand for λ·W alone. At least 1 while jobs wait or run, 0 for a paused queue."""
    if paused:
        return 0
    if mean_runtime is None and throughput > 0 and reserved:
        mean_runtime = reserved / throughput  # Little's law the other way: W = L / λ
    if mean_runtime is None:
        busy, backlog = float(reserved), 0.0
    else:
        busy = throughput * mean_runtime
        backlog = waiting * mean_runtime / max(drain_seconds, 1e-9)
    needed = math.ceil(round((busy + backlog) / max(concurrency, 1), 9))
    return max(needed, 1 if waiting or reserved else 0)


def measure(*, using: str | None = None,
            counts: dict[str, dict[str, Any]] | None = None) -> dict[str, QueueLoad]:
    """Every known queue (with rows, counts in the window, paused, or configured) measured
    now: the latency, the failure rate and throughput over ``SLO_WINDOW``, the mean runtime
    and the recommended worker count. A few queries: the dashboard's per-queue counts (index
    ranges; ``counts``: those already read), one sum over the window's per-minute rows, one
    average over the history (only with ``HISTORY = "all"``), the paused queues and the
    alert rows."""
    using = queue_database(using)
    # The alert states first, the figures after: a worker whose figures were read before
    # another worker's recovery must not find the recovered state and breach again on them
    # (each query sees its own moment; read in this order, a stale decision finds its
    # transition taken already and changes nothing).
    breached: dict[str, list[str]] = {}
    for queue, slo in QueueAlert.objects.using(using).filter(breached=True).values_list(
            "queue", "slo"):
        breached.setdefault(queue, []).append(slo)
    if counts is None:
        counts = monitoring.queue_overview(using=using)
    span = window()
    since = history.current_minute(using) - span + datetime.timedelta(minutes=1)
    finished = {row["queue"]: (row["d"] or 0, row["f"] or 0) for row in
                QueueMinute.objects.using(using).filter(minute__gte=since).order_by()
                .values("queue").annotate(d=Sum("done"), f=Sum("failed"))}
    runtimes: dict[str, float] = {}
    if history.history_mode() == "all":
        runtimes = {row["queue"]: row["mean"] for row in FinishedRun.objects.using(using)
                    .filter(finished_at__gte=Now() - span, runtime__isnull=False).order_by()
                    .values("queue").annotate(mean=Avg("runtime")) if row["mean"] is not None}
    paused = set(PausedQueue.objects.using(using).values_list("queue", flat=True))
    targets = objectives()
    out: dict[str, QueueLoad] = {}
    for name in sorted({*counts, *finished, *paused, *targets}):
        c = counts.get(name, {})
        waiting, reserved = int(c.get("waiting", 0)), int(c.get("reserved", 0))
        done, failed = finished.get(name, (0, 0))
        throughput = (done + failed) / span.total_seconds()
        mean = runtimes.get(name)
        out[name] = QueueLoad(
            queue=name, waiting=waiting, reserved=reserved,
            latency=float(c.get("oldest_waiting_seconds") or 0.0), done=done, failed=failed,
            failure_rate=failed / (done + failed) if done + failed else None,
            throughput=throughput, mean_runtime=mean,
            recommended_workers=recommended_workers(
                throughput=throughput, mean_runtime=mean, waiting=waiting, reserved=reserved,
                concurrency=worker_concurrency(name),
                drain_seconds=targets.get(name, {}).get("max_wait", DRAIN_SECONDS),
                paused=name in paused),
            paused=name in paused, breached=tuple(sorted(breached.get(name, ()))))
    return out


def _value(load: QueueLoad, slo: str) -> tuple[float, bool]:
    """``(value, may_breach)`` of objective ``slo`` for ``load``."""
    if slo == "max_wait":
        return load.latency, not load.paused  # a paused queue waits on purpose
    runs = load.done + load.failed
    return load.failure_rate or 0.0, runs >= int(jobguard_settings.SLO_MIN_RUNS)


def check(*, using: str | None = None) -> list[Crossing]:
    """Evaluate every objective (see the module docstring); returns the crossings this call
    won, each already signalled (and posted to the webhook, in the background)."""
    targets = objectives()
    if not targets:
        return []
    using = queue_database(using)
    loads = measure(using=using)
    recovery = float(jobguard_settings.SLO_RECOVERY)
    won = []
    for queue, slos in targets.items():
        load = loads[queue]
        for slo, threshold in slos.items():
            value, may_breach = _value(load, slo)
            is_breached = slo in load.breached
            if not is_breached and may_breach and value > threshold:
                crossing = Crossing(queue, slo, True, value, threshold)
            elif is_breached and value <= threshold * recovery:
                crossing = Crossing(queue, slo, False, value, threshold)
            else:
                continue
            if _transition(crossing, using=using):
                won.append(crossing)
                announce(crossing)
    return won


def _transition(crossing: Crossing, *, using: str) -> bool:
    """Change the objective's row to ``crossing.breached`` if nobody did yet: True when this
    call's UPDATE changed it (one winner among racing workers)."""
    rows = QueueAlert.objects.using(using)
    if crossing.breached:  # the row exists before the first breach (a no-op when it does)
        rows.bulk_create([QueueAlert(queue=crossing.queue, slo=crossing.slo)],
                         ignore_conflicts=True)
    return rows.filter(queue=crossing.queue, slo=crossing.slo,
                       breached=not crossing.breached).update(
        breached=crossing.breached, value=crossing.value, threshold=crossing.threshold,
        changed_at=Now()) == 1


def announce(crossing: Crossing) -> threading.Thread | None:
    """Send the signal (receivers' errors are logged) and start the webhook's POST; returns
    the POST's thread (None without ``SLO_WEBHOOK``)."""
    signal = signals.queue_slo_breached if crossing.breached else signals.queue_slo_recovered
    kwargs = {"queue": crossing.queue, "slo": crossing.slo, "value": crossing.value,
              "threshold": crossing.threshold}
    for receiver, response in signal.send_robust(sender=QueueAlert, **kwargs):
        if isinstance(response, Exception):
            logger.error("A receiver of %s (%r) raised %r.",
                         "queue_slo_breached" if crossing.breached else "queue_slo_recovered",
                         receiver, response)
    level = logging.WARNING if crossing.breached else logging.INFO
    logger.log(level, "Queue %r %s %s: %g (threshold %g).", crossing.queue,
               "breached" if crossing.breached else "recovered from", crossing.slo,
               crossing.value, crossing.threshold)
    url = jobguard_settings.SLO_WEBHOOK
    if not url:
        return None
    thread = threading.Thread(target=post_webhook, args=(url, crossing.payload()),
                              kwargs={"timeout": float(jobguard_settings.SLO_WEBHOOK_TIMEOUT)},
                              name="jobguard-slo-webhook", daemon=True)
    thread.start()
    return thread


def post_webhook(url: str, payload: dict[str, Any], *, timeout: float) -> bool:
    """POST ``payload`` as JSON to ``url``; True on a 2xx answer. Never raises: a failure
    (refused, timed out, a non-2xx status) is logged."""
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "django-jobguard"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            status = response.status
    except Exception as exc:  # urllib's HTTPError (non-2xx), URLError, timeouts
        logger.warning("SLO webhook %s for queue %r (%s %s) failed: %s", url,
                       payload.get("queue"), payload.get("slo"), payload.get("event"), exc)
        return False
    return 200 <= status < 300


def breached(*, using: str | None = None) -> dict[str, list[str]]:
    """``{queue: [objective, ...]}`` breached now."""
    out: dict[str, list[str]] = {}
    for queue, slo in QueueAlert.objects.using(queue_database(using)).filter(
            breached=True).order_by("queue", "slo").values_list("queue", "slo"):
        out.setdefault(queue, []).append(slo)
    return out

