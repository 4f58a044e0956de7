"""Dispatch → start latency on PostgreSQL: from just before ``dispatch()`` to the first line of
``handle()`` in an idle worker, with LISTEN/NOTIFY and with polling (``USE_NOTIFY=False``).

Jobs are dispatched one at a time with a random 10-30 ms gap, so the worker is idle (waiting)
when each arrives, which is the case latency matters for.
"""

from __future__ import annotations

import random
import time

from bench.common import (
    Goal,
    Report,
    Table,
    child_env,
    django_command,
    percentile,
    raw_connect,
    spawn,
    stop,
    truncate,
    wait_for_connections,
)
from bench.throughput import JOBGUARD_TABLES
from tests.support.waiting import wait_for

POLL_SLEEP = 1.0  # --sleep of the polling worker


def samples(smoke: bool) -> int:
    return 30 if smoke else 300


def measure(n: int, *, notify: bool) -> list[float]:
    """Latencies in ms of ``n`` jobs dispatched to one idle worker."""
    from bench.jobs import Stamp

    with raw_connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_latency (sent float8, started float8)")
    truncate("bench_latency", *JOBGUARD_TABLES)
    env = child_env(JOBGUARD_BENCH_NOTIFY="1" if notify else "0")
    argv = django_command("jobworker", "--queue", "bench", "--sleep", str(POLL_SLEEP))
    procs = spawn(argv, env=env)
    try:
        wait_for_connections(2 if notify else 1, procs)
        time.sleep(0.2)  # past the first (empty) claim, into the idle wait
        for _ in range(n):
            Stamp(sent=time.time()).dispatch()
            time.sleep(random.uniform(0.01, 0.03))
        with raw_connect() as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM bench_latency").fetchone()[0]
                       >= n, timeout=60, interval=0.05, what=f"{n} latency samples")
            rows = conn.execute("SELECT started - sent FROM bench_latency").fetchall()
    finally:
        stop(procs)
    truncate("bench_latency", *JOBGUARD_TABLES)
    return [r[0] * 1000 for r in rows]


def run(*, smoke: bool) -> Report:
    n = samples(smoke)
    report = Report(name="latency")
    rows = []
    for notify in (True, False):
        ms = measure(n, notify=notify)
        label = "LISTEN/NOTIFY" if notify else f"polling (--sleep {POLL_SLEEP:g})"
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        rows.append([label, len(ms), p50, p99, max(ms)])
        report.data["notify" if notify else "polling"] = {"p50_ms": p50, "p99_ms": p99,
                                                          "max_ms": max(ms), "samples": len(ms)}
    report.tables.append(Table(title="Dispatch -> start latency, ms (one idle worker)",
                               columns=["wake-up", "samples", "p50", "p99", "max"], rows=rows))
    p50 = report.data["notify"]["p50_ms"]
    report.goals.append(Goal("p50 <= 10 ms with LISTEN/NOTIFY", f"{p50:.1f} ms", p50 <= 10))
    return report
