"""I/O-bound jobs in one worker process: N jobs that each wait 50 ms (an HTTP call), run 20 at
a time, by jobguard ``--threads 20``, jobguard async (``--async-concurrency 20``, ``await
asyncio.sleep``), celery ``--pool threads -c 20`` (Redis broker) and procrastinate
``--concurrency 20`` (an ``async def`` task).

The ideal is 20 / 0.05 s = 400 jobs/s. Each tool gets the N jobs made visible at once to an
idle worker and is timed until all are done, as in ``bench/peers.py``. The full run measures
the tools in turn three times and reports each one's median (a shared machine's load moves
between runs; the order is rotated so that no tool always runs first).
"""

from __future__ import annotations

import statistics
import sys

from bench import peers
from bench.common import (
    Goal,
    Report,
    Run,
    Table,
    django_command,
    measure_processing,
    ratio,
    spawn,
    truncate,
    wait_for_connections,
    wanted,
)
from bench.throughput import JOBGUARD_TABLES, REMAINING

CONCURRENCY = 20
SECONDS = 0.05
IDEAL = CONCURRENCY / SECONDS


def sizes(smoke: bool) -> int:
    return 200 if smoke else 2_000


def rounds(smoke: bool) -> int:
    return 1 if smoke else 3


def threads_supported() -> bool:
    """Whether this jobworker has ``--threads`` (the thread executor, issue 13)."""
    from django.core.management import load_command_class

    parser = load_command_class("django_jobguard", "jobworker").create_parser("manage.py",
                                                                              "jobworker")
    return any("--threads" in action.option_strings for action in parser._actions)


def jobguard(n: int, *, kind: str) -> Run:
    """One jobworker through ``n`` waiting jobs: ``kind`` ``threads`` or ``async``."""
    from django.db import transaction

    from bench.jobs import AsyncSleep, Sleep
    from django_jobguard import dispatch_many
    from django_jobguard.conf import jobguard_settings

    job_class = AsyncSleep if kind == "async" else Sleep
    flag = "--async-concurrency" if kind == "async" else "--threads"
    truncate(*JOBGUARD_TABLES)
    argv = django_command("jobworker", "--queue", "bench", "--sleep", "5", flag,
                          str(CONCURRENCY))

    def fill(count: int) -> None:
        with transaction.atomic():
            dispatch_many([job_class() for _ in range(count)], batch_size=1000)

    run = measure_processing(
        tool=f"jobguard {kind}", processes=1, jobs=n,
        start=lambda: spawn(argv),
        ready=lambda procs: wait_for_connections(2 if jobguard_settings.USE_NOTIFY else 1,
                                                 procs),
        fill=fill, remaining_sql=REMAINING)
    truncate(*JOBGUARD_TABLES)
    return run


def celery_threads(n: int) -> Run:
    from bench.celery_app import DONE_KEY, QUEUE, app, sleep

    client = app.connection_for_write().default_channel.client
    hold = f"{QUEUE}-hold"
    client.delete(QUEUE, hold, DONE_KEY)
    argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "--pool", "threads", "-c", str(CONCURRENCY), "-Q", QUEUE, "--without-gossip",
            "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]

    def fill(count: int) -> None:
        with app.producer_or_acquire() as producer:
            for _ in range(count):
                sleep.apply_async(queue=hold, producer=producer)
        client.rename(hold, QUEUE)  # all visible at once

    run = measure_processing(
        tool="celery threads", processes=1, jobs=n, start=lambda: spawn(argv),
        ready=lambda procs: peers.celery_ready(app, procs), fill=fill,
        remaining=lambda: n - int(client.get(DONE_KEY) or 0))
    client.delete(QUEUE, hold, DONE_KEY)
    return run


def procrastinate(n: int) -> Run:
    import os

    peers.ensure_procrastinate_schema()
    os.environ["JOBGUARD_BENCH_CONNINFO"] = peers.conninfo()
    from bench.procrastinate_app import app, asleep

    truncate(*peers.PROCRASTINATE_TABLES)
    argv = [sys.executable, "-m", "procrastinate", "--app", "bench.procrastinate_app.app",
            "worker", "--queues", "jgbench", "--concurrency", str(CONCURRENCY)]

    def fill(count: int) -> None:
        with app.open():
            asleep.batch_defer(*({} for _ in range(count)))

    run = measure_processing(
        tool="procrastinate", processes=1, jobs=n,
        start=lambda: spawn(argv, env=peers.procrastinate_env()),
        ready=lambda procs: peers.settle(procs, 2), fill=fill,
        remaining_sql="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
    truncate(*peers.PROCRASTINATE_TABLES)
    return run


def run(*, smoke: bool) -> Report:
    n = sizes(smoke)
    report = Report(name="io_bound")
    tools = [("jobguard --threads 20", lambda: jobguard(n, kind="threads"), threads_supported()),
             ("jobguard async (--async-concurrency 20)", lambda: jobguard(n, kind="async"), True),
             ("celery --pool threads -c 20", lambda: celery_threads(n),
              peers.installed("celery")),
             ("procrastinate --concurrency 20 (async)", lambda: procrastinate(n),
              peers.installed("procrastinate"))]
    tools = [tool for tool in tools if wanted(tool[0])]
    samples: dict[str, list[float]] = {label: [] for label, _, _ in tools}
    for label, _, available in tools:
        if not available:
            report.notes.append(f"{label}: not available here, skipped")
    for turn in range(rounds(smoke)):
        for label, measure, available in tools[turn:] + tools[:turn]:
            if not available:
                continue
            try:
                samples[label].append(measure().rate)
            except (RuntimeError, TimeoutError) as exc:
                report.notes.append(f"{label} failed: {exc}")
    measured = {label: statistics.median(rates) if rates else None
                for label, rates in samples.items()}
    report.data["samples"] = samples
    celery = measured.get("celery --pool threads -c 20")
    report.tables.append(Table(
        title=f"I/O-bound jobs/s, one worker process, {CONCURRENCY} at a time ({n:,} jobs of "
              f"{SECONDS * 1000:.0f} ms; ideal {IDEAL:.0f}/s; median of {rounds(smoke)})",
        columns=["tool", "jobs/s", "× celery threads", "% of ideal"],
        rows=[[label, rate, ratio(rate, celery), f"{rate / IDEAL:.0%}" if rate else None]
              for label, rate in measured.items()]))
    report.data["rates"] = measured
    for label in ("jobguard --threads 20", "jobguard async (--async-concurrency 20)"):
        rate = measured.get(label)
        report.goals.append(Goal(f"{label} >= celery threads",
                                 f"{ratio(rate, celery) or 0:.2f}x",
                                 rate >= celery if rate and celery else None))
        report.goals.append(Goal(f"{label} >= 90% of the ideal {IDEAL:.0f}/s",
                                 f"{(rate or 0) / IDEAL:.0%}",
                                 rate >= 0.9 * IDEAL if rate else None))
    if smoke:
        report.notes.append(f"smoke: {n} jobs last about {n / IDEAL:.1f} s at the ideal rate, "
                            "so start-up and the last jobs weigh more than in the full run")
    return report
