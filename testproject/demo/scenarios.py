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

from django_jobguard import operations
from django_jobguard.models import FailedJob, QueuedJob

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
        seconds = (when - self.t0).total_seconds()
        if seconds >= 120:
            return f"+{seconds // 60:.0f}m{seconds % 60:02.0f}s"
        return f"+{seconds:.2f}s"

    def runs(self, label: str, **filters: Any) -> list[JobRun]:
        return list(JobRun.objects.filter(label=label, started_at__gte=self.t0, **filters)
                    .order_by("started_at"))

    def wait(self, *, ignore_delayed_over: float | None = None,
             on_tick: Callable[[], None] | None = None) -> bool:
        """Show live counts until every queued job has run (or the timeout passes).

        ``ignore_delayed_over``: done although jobs are still delayed by more than this many
        seconds (a rate limit deferred them by an hour). ``on_tick`` runs at every poll.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            if on_tick is not None:
                on_tick()
            totals = {"waiting": 0, "delayed": 0, "reserved": 0}
            for counts in operations.queue_stats().values():
                for key in totals:
                    totals[key] += counts[key]
            runs = JobRun.objects.filter(started_at__gte=self.t0)
            failed = FailedJob.objects.exclude(id__in=self.failed_before).count()
            self.progress.update(
                f"waiting {totals['waiting']} · delayed {totals['delayed']} · running "
                f"{totals['reserved']} · runs done {runs.exclude(ended_at=None).count()} · "
                f"failed jobs {failed}")
            pending = sum(totals.values()) if ignore_delayed_over is None else \
                self._pending_but_delayed_over(ignore_delayed_over)
            if not pending:
                self.progress.done()
                return True
            if time.monotonic() > deadline:
                self.progress.done()
                return False
            time.sleep(0.2)

    @staticmethod
    def _pending_but_delayed_over(seconds: float) -> int:
        """Rows left to run, leaving out those no worker holds that are due in more than
        ``seconds``: one query, so that a row moving between states (an overlap retry
        turning due and claimed at once) is never missed between two counts."""
        horizon = timezone.now() + datetime.timedelta(seconds=seconds)
        return QueuedJob.objects.exclude(reserved_at=None, available_at__gt=horizon).count()

    def waiting_rows(self, job_class: type) -> list[QueuedJob]:
        return list(QueuedJob.objects.filter(name=job_class.name, reserved_at=None))

    def drop_waiting(self, job_class: type) -> None:
        """Delete ``job_class``'s rows that are still waiting (and free their unique locks)."""
        operations.cancel(self.waiting_rows(job_class))


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


# -- overlap locks ----------------------------------------------------------------------------


def _has(*names: str) -> Callable[[], bool]:
    def available() -> bool:
        import django_jobguard

        return all(hasattr(django_jobguard, name) for name in names)
    return available


def _disjoint(runs: list[JobRun]) -> bool:
    return all(a.ended_at <= b.started_at for a, b in itertools.pairwise(runs))


def credit_score(demo: Demo) -> Outcome:
    handles = [jobs.PullCreditScore(42, run=demo.run).dispatch() for _ in range(2)]
    demo.wait()
    runs = demo.runs("credit-score", key="42")
    return Outcome([
        f"PullCreditScore(user 42) dispatched twice → {sum(map(bool, handles))} queued; "
        f"2 workers took them at once",
        *(f"run {i}: {_fmt_run(demo, r)}, attempt {r.attempt}" for i, r in enumerate(runs, 1)),
        "never overlapping: the second waited for the lock (WithoutOverlapping), and waiting "
        "did not use one of its tries",
    ], ok=len(runs) == 2 and _disjoint(runs) and all(r.attempt == 1 for r in runs))


def invoice_charge_refund(demo: Demo) -> Outcome:
    jobs.CaptureInvoicePayment(1001, run=demo.run).dispatch()
    jobs.RefundInvoicePayment(1001, run=demo.run).dispatch()
    demo.wait()
    runs = sorted(demo.runs("charge", key="1001") + demo.runs("refund", key="1001"),
                  key=lambda r: r.started_at)
    return Outcome([
        "CaptureInvoicePayment and RefundInvoicePayment for invoice 1001 share the key "
        "invoice:1001 (WithoutOverlapping(shared=True))",
        *(f"{r.label}: {_fmt_run(demo, r)}" for r in runs),
        "serialized: " + ("yes" if _disjoint(runs) else "NO, they overlapped"),
    ], ok=len(runs) == 2 and _disjoint(runs))


# -- rate limits and exception throttling --------------------------------------------------------


def pdf_exports(demo: Demo) -> Outcome:
    for n in range(8):
        jobs.ExportPdf("ann", "free", n, run=demo.run).dispatch()
        jobs.ExportPdf("bob", "premium", n, run=demo.run).dispatch()
    demo.wait(ignore_delayed_over=30)
    free = demo.runs("pdf", key="free:ann")
    premium = demo.runs("pdf", key="premium:bob")
    deferred = demo.waiting_rows(jobs.ExportPdf)
    due = min((row.available_at for row in deferred), default=None)
    demo.drop_waiting(jobs.ExportPdf)
    return Outcome([
        "8 PDF exports each: ann (free, Limit.per_hour(5)) and bob (premium, Limit.none())",
        f"ann: {len(free)} exported now, {len(deferred)} deferred until "
        f"{demo.at(due)} (attempts used by waiting: {sum(r.attempts for r in deferred)})",
        f"bob: {len(premium)} exported",
    ], ok=len(free) == 5 and len(premium) == 8 and len(deferred) == 3
        and all(r.attempts == 0 for r in deferred))


def sms_outage(demo: Demo) -> Outcome:
    flag = Profile.objects.create(name=f"sms-provider-down:{demo.run}")
    recovered: list[datetime.datetime] = []

    def recover_a_second_after_the_circuit_opened() -> None:
        errors = demo.runs("sms", key="error")
        if not recovered and len(errors) >= 3 and errors[2].ended_at and (
                timezone.now() - errors[2].ended_at).total_seconds() >= 1:
            flag.delete()
            recovered.append(timezone.now())

    for n in range(6):
        jobs.SendSms(f"+1555000{n:04d}", run=demo.run).dispatch()
    demo.wait(on_tick=recover_a_second_after_the_circuit_opened)
    runs = demo.runs("sms")
    errors = [r for r in runs if r.key == "error"]
    sent = [r for r in runs if r.key == "sent"]
    # With several workers one more attempt may already be running when the third failure
    # opens the circuit; the quiet time is measured from the last failure.
    opened = max(r.ended_at for r in errors) if len(errors) >= 3 else None
    after = [r for r in runs if opened and r.started_at > opened]
    quiet = (after[0].started_at - opened).total_seconds() if after else 0
    return Outcome([
        "6 SMS while the provider is down; ThrottlesExceptions(max_attempts=3, "
        "decay_seconds=2) on one key",
        f"{len(errors)} attempts failed; the circuit opened at {demo.at(opened)}; the provider "
        f"recovered at {demo.at(recovered[0] if recovered else None)}",
        f"no SMS was attempted for {quiet:.2f}s (circuit open), then one probe at "
        f"{demo.at(after[0].started_at) if after else '—'} succeeded and closed it",
        f"sent: {len(sent)} of 6, the last at {demo.at(sent[-1].ended_at) if sent else '—'}",
    ], ok=len(sent) == 6 and 3 <= len(errors) <= 4 and quiet >= 1.0)


def generate_report(demo: Demo) -> Outcome:
    kinds = ["sales", "sales", "sales", "stock", "tax", "payroll"]
    handles = [jobs.GenerateReport("acme", kind, run=demo.run).dispatch() for kind in kinds]
    demo.wait(ignore_delayed_over=10)
    runs = demo.runs("report")
    deferred = demo.waiting_rows(jobs.GenerateReport)
    demo.drop_waiting(jobs.GenerateReport)
    return Outcome([
        "GenerateReport = ShouldBeUnique (account, kind) + WithoutOverlapping(account) + "
        "RateLimited(3/minute per account) + ThrottlesExceptions",
        f"6 dispatches (sales ×3, stock, tax, payroll) → {sum(map(bool, handles))} queued "
        f"(unique dropped {sum(not h for h in handles)})",
        *(f"{r.key.split(':')[1]}: {_fmt_run(demo, r)}" for r in runs),
        f"never overlapping: {'yes' if _disjoint(runs) else 'NO'}; {len(deferred)} deferred "
        f"by the rate limit (attempts used: {sum(r.attempts for r in deferred)})",
    ], ok=sum(map(bool, handles)) == 4 and len(runs) == 3 and _disjoint(runs)
        and len(deferred) == 1 and deferred[0].attempts == 0)


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


# -- workflows -------------------------------------------------------------------------------


def invoice_chain(demo: Demo) -> Outcome:
    from django_jobguard import chain
    from django_jobguard.models import Chain

    steps = ["fetch", "render", "email"]
    handle = chain(*(jobs.InvoiceStep(1001, step, run=demo.run) for step in steps),
                   name=f"invoice-1001-{demo.run}").dispatch()
    demo.wait()
    runs = demo.runs("invoice-step")
    order = [run.key.split(":")[1] for run in runs]
    in_order = all(a.ended_at and a.ended_at <= b.started_at
                   for a, b in itertools.pairwise(runs))

    status = Chain.objects.get(id=handle.id).status
    return Outcome([
        f"chain(fetch, render, email) ran: {' → '.join(order)}; chain {status}",
        "each step started after the previous one ended: " + ("yes" if in_order else "NO"),
    ], ok=order == steps and in_order and status == "completed")


def import_batch(demo: Demo) -> Outcome:
    from django_jobguard import batch

    def dispatch(upload: str, bad: int = -1):
        return (batch([jobs.ImportChunk(upload, n, bad, run=demo.run) for n in range(8)],
                      name=f"{upload}-{demo.run}")
                .then(jobs.ImportCallback(upload, "then", run=demo.run))
                .catch(jobs.ImportCallback(upload, "catch", run=demo.run))
                .finally_(jobs.ImportCallback(upload, "finally", run=demo.run)).dispatch())

    good, broken = dispatch("good.csv"), dispatch("broken.csv", bad=0)
    demo.wait()
    good.refresh()
    broken.refresh()

    def ran(upload: str) -> list[str]:
        return sorted(label.removeprefix("import-") for label in JobRun.objects.filter(
            started_at__gte=demo.t0, label__in=["import-then", "import-catch", "import-finally"],
            key__startswith=upload).values_list("label", flat=True))

    chunks = {upload: len([r for r in demo.runs("import-chunk") if r.key.startswith(upload)])
              for upload in ("good.csv", "broken.csv")}
    return Outcome([
        f"good.csv: 8 chunks ran {chunks['good.csv']}; batch {good.status}, progress "
        f"{good.progress:.0%}; callbacks: {', '.join(ran('good.csv'))}",
        f"broken.csv: chunk 0 failed → batch cancelled, {chunks['broken.csv']} chunk(s) ran, "
        f"the rest skipped; batch {broken.status}; callbacks: {', '.join(ran('broken.csv'))}",
    ], ok=(chunks["good.csv"] == 8 and good.status == "completed"
           and ran("good.csv") == ["finally", "then"] and broken.status == "failed"
           and ran("broken.csv") == ["catch", "finally"]))


SCENARIOS = [
    Scenario("triple-save", 'Triple "Save" click → one CRM sync', triple_save),
    Scenario("reindex", "Product reindex dispatched 5 times → runs once", reindex_five),
    Scenario("credit-score", "Credit score pulled twice at once → never overlapping",
             credit_score, available=_has("WithoutOverlapping")),
    Scenario("invoice", "Invoice charge + refund with a shared key → serialized",
             invoice_charge_refund, available=_has("WithoutOverlapping")),
    Scenario("pdf-exports", "PDF exports: 5/hour for a free user, unlimited for premium",
             pdf_exports, available=_has("RateLimited", "Limit")),
    Scenario("sms-outage", "SMS provider outage → ThrottlesExceptions backs off, then recovers",
             sms_outage, available=_has("ThrottlesExceptions")),
    Scenario("generate-report", "GenerateReport: all four tools on one job", generate_report,
             available=_has("WithoutOverlapping", "RateLimited", "ThrottlesExceptions")),
    Scenario("retries", "Retries with backoff", retries_with_backoff),
    Scenario("failed", "A job that keeps failing lands in failed jobs", failed_job),
    Scenario("delayed", "A delayed job waits until it is due", delayed_job),
    Scenario("django-tasks", "django.tasks @task on jobguard's workers", django_tasks,
             available=_has_tasks),
    Scenario("invoice-chain", "Invoice fetch → render → email as a chain, in order",
             invoice_chain),
    Scenario("import-batch", "CSV import as a batch: then/catch/finally once each",
             import_batch),
]
