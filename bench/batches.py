"""The cost of a batch (issue 15): 10,000 no-op jobs dispatched plainly vs as one batch with
a ``then`` callback, dispatched in one transaction and processed by 2 ``jobworker``
processes, on PostgreSQL, in one run (smoke: 1,000 jobs).

A batch member's ack also locks and updates the batch row in its transaction, so the two
workers take turns on that row; the callback is queued by the last member. The time runs
from the commit of the dispatch until the queue is empty (the callback included); the runs
alternate plain / batch three times and each figure is the median. Goal: the batch within
10% of the plain jobs.
"""

from __future__ import annotations

import statistics

from bench.common import (
    Goal,
    Report,
    Table,
    django_command,
    measure_processing,
    spawn,
    truncate,
    wait_for_connections,
)
from bench.throughput import JOBGUARD_TABLES, REMAINING

WORKERS = 2
GOAL = 1.10


def _fill(as_batch: bool):
    def fill(n: int) -> None:
        from django.db import transaction

        from bench.jobs import Noop
        from django_jobguard import batch, dispatch_many

        with transaction.atomic():
            if as_batch:
                batch([Noop() for _ in range(n)], name="bench").then(Noop()).dispatch()
            else:
                dispatch_many([Noop() for _ in range(n)], batch_size=1000)
    return fill


def _run(n: int, *, as_batch: bool) -> float:
    from django_jobguard.conf import jobguard_settings

    truncate(*JOBGUARD_TABLES, "django_jobguard_batch")
    argv = django_command("jobworker", "--queue", "bench", "--sleep", "5")
    per_process = 2 if jobguard_settings.USE_NOTIFY else 1
    run = measure_processing(
        tool="batch" if as_batch else "plain", processes=WORKERS, jobs=n,
        start=lambda: spawn(argv, count=WORKERS),
        ready=lambda procs: wait_for_connections(per_process * WORKERS, procs),
        fill=_fill(as_batch), remaining_sql=REMAINING)
    if as_batch:
        from django_jobguard.models import Batch

        row = Batch.objects.get()
        assert row.finished and "then" in row.callbacks_queued, "the batch did not complete"
    truncate(*JOBGUARD_TABLES, "django_jobguard_batch")
    return run.seconds


def run(*, smoke: bool) -> Report:
    """The ``batches`` scenario for bench/run.py."""
    n = 1_000 if smoke else 10_000
    plain, batched = [], []
    for _ in range(1 if smoke else 3):
        plain.append(_run(n, as_batch=False))
        batched.append(_run(n, as_batch=True))
    p, b = statistics.median(plain), statistics.median(batched)
    report = Report(name="batches")
    report.tables.append(Table(
        title=f"{n:,} no-op jobs, {WORKERS} workers, PostgreSQL (median of {len(plain)})",
        columns=["dispatched as", "seconds", "jobs/s", "vs plain"],
        rows=[["plain dispatch_many()", round(p, 2), round(n / p), "1.00x"],
              ["one batch with then()", round(b, 2), round(n / b), f"{b / p:.2f}x"]]))
    report.goals.append(Goal(goal=f"a batch of {n:,} jobs within 10% of the same jobs "
                                  f"dispatched plainly", value=f"{b / p:.2f}x the time",
                             met=None if smoke else b / p <= GOAL))
    report.data = {"plain_seconds": plain, "batch_seconds": batched, "jobs": n}
    return report
