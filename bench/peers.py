"""jobguard beside its peers on the same PostgreSQL (and Redis for celery): no-op jobs/s with
1, 2 and 4 worker processes, each tool run the way its documentation starts a worker.

- django-tasks + django-tasks-db: ``manage.py db_worker`` (one task at a time per process);
- procrastinate: ``procrastinate worker --concurrency 1``, one process per worker, an
  ``async def`` no-op task (its native kind; a sync task ran ~25% slower here);
- celery: ``celery worker --pool prefork -c N`` with a Redis broker (no result backend).

Every tool gets N jobs made visible at once to idle workers and is timed until all are done.
A peer that is not installed (``pip install -e '.[bench]'``) is reported as skipped.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

from bench import throughput
from bench.common import (
    Goal,
    Report,
    Run,
    Table,
    child_env,
    conninfo,
    django_command,
    measure_processing,
    ratio,
    raw_connect,
    spawn,
    truncate,
    wait_for_connections,
    worker_connections,
)
from tests.support.waiting import wait_for

DTASKS_TABLE = "django_tasks_database_dbtaskresult"
PROCRASTINATE_TABLES = ("procrastinate_jobs", "procrastinate_events",
                        "procrastinate_periodic_defers")


def sizes(smoke: bool) -> dict[str, int]:
    return {"jobs": 500, "slow_jobs": 300} if smoke else {"jobs": 20_000, "slow_jobs": 5_000}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def settle(procs, minimum: int, timeout: float = 60) -> None:
    """Wait until the workers hold at least ``minimum`` connections and stop opening more."""
    wait_for_connections(minimum, procs, timeout=timeout)
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 0.5:
        now = worker_connections()
        if now != last:
            last, stable_since = now, time.monotonic()
        time.sleep(0.05)


# -- django-tasks-db ---------------------------------------------------------------------------


def django_tasks_db(processes: int, n: int) -> Run:
    from django.db import transaction

    from bench.dtasks import noop

    truncate(DTASKS_TABLE)
    argv = django_command("db_worker", "--interval", "0.05", "--no-startup-delay")

    def fill(count: int) -> None:
        with transaction.atomic():
            for _ in range(count):
                noop.enqueue()

    run = measure_processing(
        tool="django-tasks-db", processes=processes, jobs=n,
        start=lambda: spawn(argv, count=processes),
        ready=lambda procs: settle(procs, processes),
        fill=fill,
        remaining_sql=f"SELECT count(*) FROM {DTASKS_TABLE} WHERE status IN ('READY', 'RUNNING')",
    )
    truncate(DTASKS_TABLE)
    return run


# -- procrastinate -----------------------------------------------------------------------------


def procrastinate_env() -> dict[str, str]:
    return child_env(JOBGUARD_BENCH_CONNINFO=conninfo())


def ensure_procrastinate_schema() -> None:
    with raw_connect() as conn:
        present = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0]
    if not present:
        os.environ["JOBGUARD_BENCH_CONNINFO"] = conninfo()
        from bench.procrastinate_app import app

        with app.open():
            app.schema_manager.apply_schema()


def procrastinate(processes: int, n: int) -> Run:
    ensure_procrastinate_schema()
    os.environ["JOBGUARD_BENCH_CONNINFO"] = conninfo()
    from bench.procrastinate_app import anoop, app

    truncate(*PROCRASTINATE_TABLES)
    argv = [sys.executable, "-m", "procrastinate", "--app", "bench.procrastinate_app.app",
            "worker", "--queues", "jgbench", "--concurrency", "1"]

    def fill(count: int) -> None:
        with app.open():
            # the async task: procrastinate runs it on its event loop, faster than a sync one
            anoop.batch_defer(*({} for _ in range(count)))  # one statement, one transaction

    run = measure_processing(
        tool="procrastinate", processes=processes, jobs=n,
        start=lambda: spawn(argv, count=processes, env=procrastinate_env()),
        ready=lambda procs: settle(procs, 2 * processes),
        fill=fill,
        remaining_sql="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    )
    truncate(*PROCRASTINATE_TABLES)
    return run


# -- celery ------------------------------------------------------------------------------------


def celery_ready(app, procs) -> None:
    """Wait until the celery worker answers a ping."""
    def pong() -> bool:
        if procs[0].poll() is not None:
            raise RuntimeError(f"celery worker exited with {procs[0].returncode}")
        return bool(app.control.inspect(timeout=0.5).ping())

    wait_for(pong, timeout=60, interval=0.2, what="celery ping")


def celery(processes: int, n: int) -> Run:
    from bench.celery_app import DONE_KEY, QUEUE, app, noop

    client = app.connection_for_write().default_channel.client
    hold = f"{QUEUE}-hold"
    client.delete(QUEUE, hold, DONE_KEY)
    argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "--pool", "prefork", "-c", str(processes), "-Q", QUEUE, "--without-gossip",
            "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]

    def fill(count: int) -> None:
        # Publish to a queue no worker reads, then rename it in one atomic step: the workers
        # see all the messages at once, as the database tools see one committed transaction.
        with app.producer_or_acquire() as producer:
            for _ in range(count):
                noop.apply_async(queue=hold, producer=producer)
        client.rename(hold, QUEUE)

    run = measure_processing(
        tool="celery (redis)", processes=processes, jobs=n,
        start=lambda: spawn(argv),
        ready=lambda procs: celery_ready(app, procs), fill=fill,
        remaining=lambda: n - int(client.get(DONE_KEY) or 0),
    )
    client.delete(QUEUE, hold, DONE_KEY)
    return run


# -- the scenario ------------------------------------------------------------------------------


def run(*, smoke: bool) -> Report:
    n = sizes(smoke)
    report = Report(name="peers")
    counts = throughput.process_counts(smoke)
    peers = [("django-tasks-db", "django_tasks_db", django_tasks_db, n["slow_jobs"]),
             ("procrastinate", "procrastinate", procrastinate, n["slow_jobs"]),
             ("celery (redis)", "celery", celery, n["jobs"])]
    columns = ["workers", "jobguard", "jobguard --batch 10"]
    results: dict[str, dict[int, float | None]] = {}
    rows = []
    for processes in counts:
        jg = throughput.jobguard_processing(processes, n["jobs"]).rate
        jg10 = throughput.jobguard_processing(processes, n["jobs"], batch=10).rate
        row: list = [processes, jg, jg10]
        results.setdefault("jobguard", {})[processes] = jg
        results.setdefault("jobguard --batch 10", {})[processes] = jg10
        for label, module, measure, jobs in peers:
            rate = None
            if installed(module):
                try:
                    rate = measure(processes, jobs).rate
                except (RuntimeError, TimeoutError) as exc:  # one peer's failure is a note
                    report.notes.append(f"{label} with {processes} workers failed: {exc}")
            results.setdefault(label, {})[processes] = rate
            row += [rate, ratio(jg, rate)]
        rows.append(row)
    for label, module, _, _ in peers:
        columns += [label, "jobguard ×"]
        if not installed(module):
            report.notes.append(f"{label}: not installed (pip install -e '.[bench]'), skipped")
    report.tables.append(Table(
        title=f"Processing no-op jobs/s, jobguard vs peers ({n['jobs']:,} jobs; "
              f"django-tasks-db and procrastinate {n['slow_jobs']:,})",
        columns=columns, rows=rows))
    report.data["rates"] = results
    top = counts[-1]
    dtdb = results["django-tasks-db"].get(top)
    jg = results["jobguard"][top]
    report.goals.append(Goal(f">= 3x django-tasks-db ({top} workers)",
                             f"{ratio(jg, dtdb) or 0:.1f}x", (ratio(jg, dtdb) or 0) >= 3
                             if dtdb else None))
    for processes in counts:
        c = results["celery (redis)"].get(processes)
        j = results["jobguard"][processes]
        report.goals.append(Goal(f"default jobworker >= celery (redis) at {processes} workers",
                                 f"{ratio(j, c) or 0:.2f}x", j >= c if c else None))
    for processes in counts:
        p = results["procrastinate"].get(processes)
        j = results["jobguard"][processes]
        report.goals.append(Goal(f">= procrastinate at {processes} workers",
                                 f"{ratio(j, p) or 0:.2f}x", j >= p if p else None))
    return report
