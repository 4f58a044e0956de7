"""Backlog scaling and memory on PostgreSQL.

- Throughput of 4 workers taking the first 8k jobs from a queue holding 10k rows vs 1M rows
  (smoke: 2k from 10k vs 100k): the claim must not slow down with the depth of the queue.
- Peak RSS of one worker over 100k jobs (smoke: 10k), sampled as it goes: it must not grow.
"""

from __future__ import annotations

import time

from bench.common import (
    Goal,
    Report,
    Table,
    django_command,
    ratio,
    raw_connect,
    spawn,
    stop,
    truncate,
    wait_for_connections,
)
from bench.throughput import JOBGUARD_TABLES, REMAINING, jobguard_fill
from tests.support.waiting import wait_for

BACKLOG_INSERT = """
    INSERT INTO django_jobguard_queuedjob (id, queue, name, payload, attempts, exceptions,
                                           priority, available_at, reserved_by, last_error)
    SELECT gen_random_uuid(), 'bench', 'bench.Noop', '{"args": [], "kwargs": {}}', 0, 0, 0,
           statement_timestamp(), '', ''
      FROM generate_series(1, %s)"""


def sizes(smoke: bool) -> dict:
    if smoke:
        return {"backlogs": [10_000, 100_000], "take": 2_000, "rss_jobs": 10_000}
    # take stays below the smaller backlog: the workers must never run the queue dry
    return {"backlogs": [10_000, 1_000_000], "take": 8_000, "rss_jobs": 100_000}


def take_from_backlog(backlog: int, take: int, processes: int = 4) -> float:
    """jobs/s of ``processes`` workers each taking ``take / processes`` jobs from the backlog."""
    truncate(*JOBGUARD_TABLES)
    per = take // processes
    argv = django_command("jobworker", "--queue", "bench", "--sleep", "5",
                          "--max-jobs", str(per))
    procs = spawn(argv, count=processes)
    try:
        wait_for_connections(2 * processes, procs)
        with raw_connect(autocommit=False) as conn:
            conn.execute(BACKLOG_INSERT, [backlog])
            conn.execute("SELECT pg_notify('jobguard', 'bench')")
            conn.commit()
        t0 = time.perf_counter()
        for proc in procs:
            proc.wait(timeout=600)
        seconds = time.perf_counter() - t0
        codes = [p.returncode for p in procs]
        if any(codes):
            raise RuntimeError(f"workers exited with {codes}")
    finally:
        stop(procs)
    truncate(*JOBGUARD_TABLES)
    return per * processes / seconds


def rss_over_jobs(n: int) -> list[tuple[int, float]]:
    """(jobs done, RSS MB) samples of one worker running ``n`` jobs."""
    import psutil

    truncate(*JOBGUARD_TABLES)
    for start in range(0, n, 50_000):
        jobguard_fill(min(50_000, n - start))
    argv = django_command("jobworker", "--queue", "bench", "--stop-when-empty", "--sleep", "0",
                          "--batch", "10", "--memory", "0")
    procs = spawn(argv)
    samples: list[tuple[int, float]] = []
    try:
        proc = psutil.Process(procs[0].pid)
        with raw_connect() as conn:
            while procs[0].poll() is None:
                try:
                    rss = proc.memory_info().rss / 2**20
                except psutil.NoSuchProcess:
                    break
                left = conn.execute(REMAINING).fetchone()[0]
                samples.append((n - left, rss))
                time.sleep(0.5)
        wait_for(lambda: procs[0].poll() is not None, timeout=600, what="worker exit")
    finally:
        stop(procs)
    truncate(*JOBGUARD_TABLES)
    return samples


def run(*, smoke: bool) -> Report:
    s = sizes(smoke)
    report = Report(name="backlog")
    rates = {backlog: take_from_backlog(backlog, s["take"]) for backlog in s["backlogs"]}
    small, large = s["backlogs"]
    report.tables.append(Table(
        title=f"4 workers taking {s['take']:,} jobs from a backlog, jobs/s",
        columns=["waiting rows", "jobs/s", f"vs {small:,}"],
        rows=[[f"{b:,}", r, ratio(r, rates[small])] for b, r in rates.items()]))
    report.data["backlog_rates"] = rates
    kept = ratio(rates[large], rates[small]) or 0
    report.goals.append(Goal(f"throughput at {large:,} within 20% of {small:,}",
                             f"{kept:.0%}", kept >= 0.8))

    samples = rss_over_jobs(s["rss_jobs"])
    settled = [rss for done, rss in samples if done >= s["rss_jobs"] * 0.1] or [0.0]
    first, last, peak = settled[0], settled[-1], max(rss for _, rss in samples)
    report.tables.append(Table(
        title=f"Worker RSS over {s['rss_jobs']:,} no-op jobs (--batch 10), MB",
        columns=["after 10%", "at the end", "peak", "growth"],
        rows=[[first, last, peak, last - first]]))
    report.data["rss_samples"] = samples
    report.goals.append(Goal(f"no RSS growth over {s['rss_jobs']:,} jobs",
                             f"{last - first:+.1f} MB", last - first < 2.0))
    return report
