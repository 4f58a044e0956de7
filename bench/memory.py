"""Memory of 20 jobs at once: one ``jobworker --threads 20``, one ``jobworker
--async-concurrency 20``, and ``jobworker --concurrency 20`` (a supervisor and 20 single-job
processes, the way to run 20 jobs at once before threads).

Each worker first runs a round of 50 ms jobs (so that every thread or child has its database
connection and has run jobs), then the memory of its whole process tree is read with psutil:
RSS (what ``top`` shows, pages shared between processes counted in each) and PSS (shared
pages split between the processes sharing them: the fair total).
"""

from __future__ import annotations

import time

from bench.common import Goal, Report, Table, count, django_command, ratio, spawn, stop, truncate
from bench.throughput import JOBGUARD_TABLES, REMAINING
from tests.support.waiting import wait_for


def sizes(smoke: bool) -> dict[str, int]:
    return {"at_once": 4, "jobs": 40} if smoke else {"at_once": 20, "jobs": 400}


def tree_memory(pid: int) -> dict[str, float]:
    """RSS and PSS in MB of process ``pid`` and its descendants (the watchdogs included)."""
    import psutil

    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    rss = pss = 0.0
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return {"processes": len(procs), "rss_mb": rss / 2**20, "pss_mb": pss / 2**20}


def measure(label: str, flags: list[str], *, jobs: int, async_jobs: bool) -> dict:
    from django.db import transaction

    from bench.jobs import AsyncSleep, Sleep
    from django_jobguard import dispatch_many

    truncate(*JOBGUARD_TABLES)
    procs = spawn(django_command("jobworker", "--queue", "bench", "--sleep", "0.5", *flags))
    try:
        job_class = AsyncSleep if async_jobs else Sleep
        with transaction.atomic():
            dispatch_many([job_class() for _ in range(jobs)])
        wait_for(lambda: count(REMAINING) == 0, timeout=300, interval=0.1,
                 what=f"{label} to run its jobs")
        time.sleep(0.5)  # let the last threads go idle (memory, not time, is measured)
        if procs[0].poll() is not None:
            raise RuntimeError(f"{label} exited with {procs[0].returncode}")
        return {"label": label, **tree_memory(procs[0].pid)}
    finally:
        stop(procs)
        truncate(*JOBGUARD_TABLES)


def run(*, smoke: bool) -> Report:
    n = sizes(smoke)
    k = n["at_once"]
    report = Report(name="memory")
    rows = [
        measure(f"--threads {k}", ["--threads", str(k)], jobs=n["jobs"], async_jobs=False),
        measure(f"--async-concurrency {k}", ["--async-concurrency", str(k)], jobs=n["jobs"],
                async_jobs=True),
        measure(f"--concurrency {k} (processes)", ["--concurrency", str(k)], jobs=n["jobs"],
                async_jobs=False),
    ]
    processes = rows[-1]
    report.tables.append(Table(
        title=f"Memory of {k} jobs at once, after {n['jobs']} jobs of 50 ms (MB, whole process "
              f"tree incl. watchdogs)",
        columns=["worker", "processes", "RSS", "PSS", "PSS vs processes"],
        rows=[[r["label"], r["processes"], r["rss_mb"], r["pss_mb"],
               ratio(r["pss_mb"], processes["pss_mb"])] for r in rows]))
    report.data["memory"] = rows
    for r in rows[:2]:
        share = ratio(r["pss_mb"], processes["pss_mb"]) or 0
        report.goals.append(Goal(f"{r['label']} uses less memory than {k} processes (PSS)",
                                 f"{share:.0%} of theirs", share < 1))
    return report
