"""The seed scenarios of ``manage.py jobguard_demo``, one small function each.

A scenario dispatches jobs (see ``scenario_jobs.py``), waits while the demo's real worker
processes run them (:meth:`Demo.wait` shows live counts), then reads the ``JobRun`` rows and
returns an :class:`Outcome`: the lines to print and whether jobguard behaved as promised.
"""

from __future__ import annotations

import datetime
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from django_jobguard import queue
from django_jobguard.models import FailedJob

from . import scenario_jobs as jobs
from .models import JobRun, Profile


@dataclass
class Outcome:
    lines: list[str]
    ok: bool


@dataclass
class Scenario:
    slug: str
    title: str
    run: Callable[[Demo], Outcome]
    available: Callable[[], bool] = field(default=lambda: True)


class Demo:
    """What scenarios use: the run id, relative times, and waiting for the workers."""

    def __init__(self, *, run: str, progress: Any, timeout: float = 60) -> None:
        self.run = run
        self.progress = progress
        self.timeout = timeout
        self.t0 = timezone.now()

    def start(self) -> None:
        self.t0 = timezone.now()
        self.failed_before = set(FailedJob.objects.values_list("id", flat=True))

    def at(self, when: datetime.datetime | None) -> str:
        """``when`` as seconds since the scenario started: ``+1.52s``."""
        if when is None:
            return "—"
        return f"+{(when - self.t0).total_seconds():.2f}s"

    def runs(self, label: str, **filters: Any) -> list[JobRun]:
        return list(JobRun.objects.filter(label=label, started_at__gte=self.t0, **filters)
                    .order_by("started_at"))

    def wait(self) -> bool:
        """Show live counts until every queued job has run (or the timeout passes)."""
        deadline = time.monotonic() + self.timeout
        while True:
            totals = {"waiting": 0, "delayed": 0, "reserved": 0}
            for counts in queue.stats().values():
                for key in totals:
                    totals[key] += counts[key]
            runs = JobRun.objects.filter(started_at__gte=self.t0)
            failed = FailedJob.objects.exclude(id__in=self.failed_before).count()
            self.progress.update(
                f"waiting {totals['waiting']} · delayed {totals['delayed']} · running "
                f"{totals['reserved']} · runs done {runs.exclude(ended_at=None).count()} · "
                f"failed jobs {failed}")
            if not any(totals.values()):
                self.progress.done()
                return True
            if time.monotonic() > deadline:
                self.progress.done()
                return False
            time.sleep(0.2)


def _fmt_run(demo: Demo, run: JobRun) -> str:
    return f"{demo.at(run.started_at)} → {demo.at(run.ended_at)} (worker pid {run.pid})"


# -- unique jobs -----------------------------------------------------------------------------


def triple_save(demo: Demo) -> Outcome:
    profile = Profile.objects.create(name="Ann")
    handles = [jobs.SyncProfileToCrm(profile.pk, run=demo.run).dispatch() for _ in range(3)]
    demo.wait()
    runs = demo.runs("crm-sync", key=str(profile.pk))
    profile.refresh_from_db()
    said = ", ".join("queued" if h else f"skipped ({h.skipped})" for h in handles)
    return Outcome([
        f"Save clicked 3 times → dispatch() said: {said}",
        f"CRM sync jobs that ran: {len(runs)}; profile.syncs = {profile.syncs}",
    ], ok=len(runs) == 1 and profile.syncs == 1 and sum(map(bool, handles)) == 1)


def reindex_five(demo: Demo) -> Outcome:
    handles = [jobs.ReindexProducts(run=demo.run).dispatch() for _ in range(5)]
    demo.wait()
    runs = demo.runs("reindex")
    return Outcome([
        f"ReindexProducts dispatched 5 times → queued {sum(map(bool, handles))}, skipped "
        f"{sum(not h for h in handles)} (ShouldBeUnique, one per class)",
        f"reindex runs: {len(runs)}" + (f" — {_fmt_run(demo, runs[0])}" if runs else ""),
        "after it finished the lock is free again: the next reindex can queue",
    ], ok=len(runs) == 1 and sum(map(bool, handles)) == 1)


# -- foundation: retries, failures, delays -----------------------------------------------------


def retries_with_backoff(demo: Demo) -> Outcome:
    jobs.DeliverWebhook("https://partner.example/hook", failures=2).dispatch()
    demo.wait()
    runs = demo.runs("webhook")
    steps = " → ".join(f"attempt {r.attempt} at {demo.at(r.started_at)} {r.key}" for r in runs)
    gaps = [(b.started_at - a.ended_at).total_seconds() for a, b in itertools.pairwise(runs)]
    backoff_ok = len(gaps) == 2 and gaps[0] >= 0.45 and gaps[1] >= 0.95
    return Outcome([
        "DeliverWebhook (tries=3, backoff=[0.5, 1.0]) against an endpoint that fails twice:",
        steps or "no run",
        "waits between attempts: " + ", ".join(f"{g:.2f}s" for g in gaps),
    ], ok=[r.key for r in runs] == ["error", "error", "ok"] and backoff_ok)


def failed_job(demo: Demo) -> Outcome:
    handle = jobs.ChargeExpiredCard("INV-1001").dispatch()
    demo.wait()
    runs = demo.runs("expired-card")
    failed = FailedJob.objects.filter(id=handle.id).first()
    lines = [f"ChargeExpiredCard (tries=2) ran {len(runs)} times and failed every time"]
    if failed is not None:
        lines += [
            f"failed job {failed.id}: {failed.exception_class.rsplit('.', 1)[-1]}: "
            f"{failed.message} (attempts {failed.attempts})",
            "inspect: manage.py jobs_failed · retry: manage.py jobs_retry <id> · "
            "drop: manage.py jobs_forget <id>",
        ]
    return Outcome(lines, ok=failed is not None and failed.attempts == 2 and len(runs) == 2)


def delayed_job(demo: Demo) -> Outcome:
    dispatched = timezone.now()
    jobs.SendReminder("ann").dispatch(delay=1.5)
    demo.wait()
    runs = demo.runs("reminder")
    waited = (runs[0].started_at - dispatched).total_seconds() if runs else 0
    return Outcome([
        f"SendReminder dispatched at {demo.at(dispatched)} with delay=1.5 s",
        f"a worker started it at {demo.at(runs[0].started_at)} ({waited:.2f}s later)"
        if runs else "it never ran",
    ], ok=len(runs) == 1 and waited >= 1.45)


# -- django.tasks ----------------------------------------------------------------------------


def _has_tasks() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "TASKS", None))


def django_tasks(demo: Demo) -> Outcome:
    from .tasks import refresh_product_cache

    results = [refresh_product_cache.enqueue(7, run=demo.run) for _ in range(3)]
    first = results[0]
    before = first.status
    demo.wait()
    first.refresh()
    return Outcome([
        "@task(unique_key=..., unique_for=60) refresh_product_cache enqueued 3 times → "
        f"{len({r.id for r in results})} result id",
        f"status {before} → {first.status}; return_value {first.return_value}; attempts "
        f"{first.attempts}; ran {demo.at(first.started_at)} → {demo.at(first.finished_at)}",
    ], ok=len({r.id for r in results}) == 1 and first.return_value == {"product_id": 7,
                                                                         "entries": 42})


SCENARIOS = [
    Scenario("triple-save", 'Triple "Save" click → one CRM sync', triple_save),
    Scenario("reindex", "Product reindex dispatched 5 times → runs once", reindex_five),
    Scenario("retries", "Retries with backoff", retries_with_backoff),
    Scenario("failed", "A job that keeps failing lands in failed jobs", failed_job),
    Scenario("delayed", "A delayed job waits until it is due", delayed_job),
    Scenario("django-tasks", "django.tasks @task on jobguard's workers", django_tasks,
             available=_has_tasks),
]
