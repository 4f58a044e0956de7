"""The cost of the finished-job history (issue 31): 10,000 no-op jobs processed by 2
``jobworker`` processes with ``HISTORY = "off"`` and ``"all"``, on PostgreSQL, alternating
three times (smoke: once, 1,000 jobs); each figure is the median.

No-op jobs are the worst case: the per-job cost of buffering a run is all there is to see.
Both variants run with ``RETRY_AFTER = 6`` (``DEFAULT_TIMEOUT = 5``; a heartbeat, so a bulk
insert, every 2 s), so most of the history's inserts fall inside the timed window, which ends
when the queue is empty; the runs still buffered then are inserted when the workers stop
(gracefully, after the timed window): every run must be there, none twice. Goal: history
on within 10% of off.
"""

from __future__ import annotations

import statistics

from bench.common import (
    Goal,
    Report,
    Table,
    child_env,
    django_command,
    measure_processing,
    spawn,
    truncate,
    wait_for_connections,
)
from bench.throughput import JOBGUARD_TABLES, REMAINING, jobguard_fill

WORKERS = 2
GOAL = 1.10
TABLES = (*JOBGUARD_TABLES, "django_jobguard_finishedrun", "django_jobguard_runstatistic")


def _run(n: int, *, history: str) -> tuple[float, float, float]:
    """Seconds until the queue is empty, and the CPU seconds of the workers and of their
    PostgreSQL backends meanwhile."""
    from django_jobguard.models import FinishedRun

    truncate(*TABLES)
    env = child_env(JOBGUARD_BENCH_HISTORY=history, JOBGUARD_BENCH_RETRY_AFTER="6",
                    JOBGUARD_BENCH_DEFAULT_TIMEOUT="5")
    argv = django_command("jobworker", "--queue", "bench", "--sleep", "5")
    procs: list = []

    def start() -> list:
        procs[:] = spawn(argv, count=WORKERS, env=env)
        return procs

    run = measure_processing(
        tool=f"history {history}", processes=WORKERS, jobs=n, start=start,
        ready=lambda ps: wait_for_connections(2 * WORKERS, ps),  # queries + LISTEN
        fill=jobguard_fill, remaining_sql=REMAINING, cpu=True)
    recorded = FinishedRun.objects.count()  # the workers were stopped gracefully
    assert recorded == (n if history == "all" else 0), f"{recorded} runs recorded, not {n}"
    truncate(*TABLES)
    return run.seconds, run.worker_cpu or 0.0, run.store_cpu or 0.0


def run(*, smoke: bool) -> Report:
    """The ``history`` scenario for bench/run.py."""
    n = 1_000 if smoke else 10_000
    off, on = [], []
    cpu: dict[str, list[tuple[float, float]]] = {"off": [], "all": []}
    for _ in range(1 if smoke else 3):
        seconds, workers, store = _run(n, history="off")
        off.append(seconds)
        cpu["off"].append((workers, store))
        seconds, workers, store = _run(n, history="all")
        on.append(seconds)
        cpu["all"].append((workers, store))
    o, a = statistics.median(off), statistics.median(on)

    def cpu_ms(mode: str, which: int) -> float:  # CPU milliseconds per 1,000 jobs
        return round(statistics.median(c[which] for c in cpu[mode]) / n * 1e6, 1)
    report = Report(name="history")
    report.tables.append(Table(
        title=f"{n:,} no-op jobs, {WORKERS} workers, PostgreSQL (median of {len(off)})",
        columns=["HISTORY", "seconds", "jobs/s", "vs off", "worker CPU ms / 1k jobs",
                 "PostgreSQL CPU ms / 1k jobs"],
        rows=[['"off"', round(o, 2), round(n / o), "1.00x", cpu_ms("off", 0), cpu_ms("off", 1)],
              ['"all"', round(a, 2), round(n / a), f"{a / o:.2f}x", cpu_ms("all", 0),
               cpu_ms("all", 1)]]))
    report.goals.append(Goal(goal="history on for every run within 10% of off (no-op jobs)",
                             value=f"{a / o:.2f}x the time", met=None if smoke else a / o <= GOAL))
    report.data = {"off_seconds": off, "all_seconds": on, "jobs": n,
                   "cpu_seconds": cpu}
    return report
