"""What a worker process counts: its jobs by outcome, and their run times.

``jobguard_jobs_total{queue,job,outcome}`` counts every job line but RUNNING (outcome:
``done``, ``skipped``, ``deleted``, ``cancelled``, ``released``, ``failed``, ``lost``);
``jobguard_job_duration_seconds{queue,job}`` times the runs that ended ``done`` or
``failed`` (from the start of the row's processing to its outcome, as the job line shows;
releases and skips would bury the run times under the time a lock check takes): the per-class
runtime histogram. ``jobguard_job_wait_seconds{queue,job}`` is the per-class wait histogram:
for the same runs, the seconds from when the job became due to its claim.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from django_jobguard import observe
from django_jobguard.outcome import JobState

logger = logging.getLogger("django_jobguard.metrics")

#: Seconds; jobs run from milliseconds to an hour.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
           120.0, 300.0, 600.0, 1800.0, 3600.0)
TIMED = frozenset(state for state in JobState if state.is_timed)


class Recorder:
    """The worker-side metrics in ``registry``, fed by :func:`observe.job_line`."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.registry = registry
        self.jobs = Counter("jobguard_jobs", "Jobs processed by this worker, by outcome.",
                            ["queue", "job", "outcome"], registry=registry)
        self.duration = Histogram("jobguard_job_duration_seconds",
                                  "Run time of the jobs that ended done or failed.",
                                  ["queue", "job"], buckets=BUCKETS, registry=registry)
        self.wait = Histogram("jobguard_job_wait_seconds",
                              "Seconds the jobs that ended done or failed waited from due to "
                              "claimed.", ["queue", "job"], buckets=BUCKETS, registry=registry)

    def __call__(self, row: Any, state: str, elapsed: float | None) -> None:
        try:
            self.jobs.labels(row.queue, row.name, state.lower()).inc()
            if state in TIMED and elapsed is not None:
                self.duration.labels(row.queue, row.name).observe(elapsed)
                wait = waited(row)
                if wait is not None:
                    self.wait.labels(row.queue, row.name).observe(wait)
        except Exception:  # a metric must never break a job's outcome
            logger.exception("Could not record the metrics of %s [%s].", row.name, row.id)


def waited(row: Any) -> float | None:
    """Seconds ``row`` waited from due (``available_at`` before the claim moved it) to its
    claim (``reserved_at``), as the finished-run history computes it; None if unknown."""
    due, reserved = getattr(row, "available_at", None), getattr(row, "reserved_at", None)
    if isinstance(due, datetime.datetime) and isinstance(reserved, datetime.datetime):
        return max((reserved - due).total_seconds(), 0.0)
    return None


_recorder: Recorder | None = None


def start_recording(registry: CollectorRegistry | None = REGISTRY) -> Recorder:
    """Record this process's job lines (once per process; ``registry``: where the metrics
    live, the default registry unless a test passes its own)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(registry)
        observe.add_recorder(_recorder)
    return _recorder


def stop_recording() -> None:
    """Stop recording and unregister the metrics (tests)."""
    global _recorder
    if _recorder is None:
        return
    observe.remove_recorder(_recorder)
    for metric in (_recorder.jobs, _recorder.duration, _recorder.wait):
        if _recorder.registry is not None:
            _recorder.registry.unregister(metric)
    _recorder = None
