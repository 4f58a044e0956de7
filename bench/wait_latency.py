"""``handle.wait()`` latency on PostgreSQL: from the end of ``handle()`` in an idle worker to
``wait()`` returning in the dispatching process, woken by the result's NOTIFY (the time
includes the worker's ack and result write, so it bounds "within N ms of the ack").

One job at a time, each waited for before the next is dispatched.
"""

from __future__ import annotations

import time

from bench.common import (
    Goal,
    Report,
    Table,
    child_env,
    django_command,
    percentile,
    spawn,
    stop,
    truncate,
    wait_for_connections,
)
from bench.throughput import JOBGUARD_TABLES


def samples(smoke: bool) -> int:
    return 30 if smoke else 300


def measure(n: int) -> list[float]:
    """Milliseconds from each job's end to ``wait()`` returning its result."""
    from bench.jobs import Finished

    truncate(*JOBGUARD_TABLES, "django_jobguard_jobresult")
    procs = spawn(django_command("jobworker", "--queue", "bench", "--sleep", "1"),
                  env=child_env(JOBGUARD_BENCH_NOTIFY="1"))
    try:
        wait_for_connections(2, procs)
        time.sleep(0.2)  # past the first (empty) claim, into the idle wait
        ms = []
        for _ in range(n):
            ended = Finished().dispatch().wait(timeout=30)
            ms.append((time.time() - ended) * 1000)
    finally:
        stop(procs)
    truncate(*JOBGUARD_TABLES, "django_jobguard_jobresult")
    return ms


def run(*, smoke: bool) -> Report:
    ms = measure(samples(smoke))
    report = Report(name="wait_latency")
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    report.data["notify"] = {"p50_ms": p50, "p99_ms": p99, "max_ms": max(ms),
                             "samples": len(ms)}
    report.tables.append(Table(title="handle() end -> wait() returns, ms (one idle worker)",
                               columns=["wake-up", "samples", "p50", "p99", "max"],
                               rows=[["LISTEN/NOTIFY", len(ms), p50, p99, max(ms)]]))
    report.goals.append(Goal("p50 <= 5 ms after the job's end", f"{p50:.1f} ms", p50 <= 5))
    return report
