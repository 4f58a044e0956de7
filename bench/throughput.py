"""No-op jobs/s on PostgreSQL: dispatch (one by one and ``dispatch_many``) and processing with
1, 2 and 4 ``jobworker`` processes, each beside the raw-SQL floor (``bench/floor.py``: plain
psycopg INSERT / claim / DELETE on a copy of the same table) as a ratio. On MariaDB
(``bench/run.py --database mysql://...``) the same jobguard figures, without the floor.

Processing is timed from the commit that makes N jobs visible to idle workers until the queue
is empty, so start-up costs are left out for every tool alike.
"""

from __future__ import annotations

import sys
import time

from bench import floor
from bench.common import (
    Goal,
    Report,
    Run,
    Table,
    child_env,
    conninfo,
    django_command,
    measure_processing,
    postgresql,
    ratio,
    raw_connect,
    spawn,
    truncate,
    vendor,
    wait_for_connections,
)
from tests.support.waiting import wait_for

JOBGUARD_TABLES = ("django_jobguard_queuedjob", "django_jobguard_failedjob",
                   "django_jobguard_worker")
REMAINING = "SELECT count(*) FROM django_jobguard_queuedjob WHERE queue = 'bench'"
FLOOR_REMAINING = f"SELECT count(*) FROM {floor.TABLE}"


def sizes(smoke: bool) -> dict[str, int]:
    if smoke:
        return {"single": 300, "bulk": 5_000, "process": 1_000}
    return {"single": 5_000, "bulk": 100_000, "process": 20_000}


def process_counts(smoke: bool) -> list[int]:
    return [1, 2] if smoke else [1, 2, 4]


# -- dispatch ----------------------------------------------------------------------------------


def jobguard_dispatch_single(n: int, *, notify: bool = True) -> float:
    from django.test import override_settings

    from bench.jobs import Noop
    from django_jobguard.conf import jobguard_settings

    truncate(*JOBGUARD_TABLES)
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "USE_NOTIFY": notify}):
        t0 = time.perf_counter()
        for _ in range(n):
            Noop().dispatch()
        rate = n / (time.perf_counter() - t0)
    truncate(*JOBGUARD_TABLES)
    return rate


def jobguard_dispatch_bulk(n: int, chunk: int = 10_000) -> float:
    from bench.jobs import Noop
    from django_jobguard import dispatch_many

    truncate(*JOBGUARD_TABLES)
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        dispatch_many([Noop() for _ in range(min(chunk, n - start))])
    rate = n / (time.perf_counter() - t0)
    truncate(*JOBGUARD_TABLES)
    return rate


def floor_dispatch(n: int, *, bulk: bool, notify: bool = False) -> float:
    ensure_floor_table()
    with raw_connect() as conn:
        t0 = time.perf_counter()
        if bulk:
            floor.insert_bulk(conn, n)
        else:
            floor.insert_single(conn, n, notify=notify)
        rate = n / (time.perf_counter() - t0)
    truncate(floor.TABLE)
    return rate


def ensure_floor_table() -> None:
    with raw_connect() as conn:
        conn.execute(floor.CREATE)
    truncate(floor.TABLE)


# -- processing --------------------------------------------------------------------------------


def jobguard_fill(n: int, *, is_async: bool = False) -> None:
    """Queue ``n`` no-op jobs in one transaction (they appear to the workers at once);
    ``is_async``: ``async def`` ones."""
    from django.db import transaction

    from bench.jobs import AsyncNoop, Noop
    from django_jobguard import dispatch_many

    job_class = AsyncNoop if is_async else Noop
    with transaction.atomic():
        dispatch_many([job_class() for _ in range(n)], batch_size=1000)


def jobguard_processing(processes: int, n: int, *, batch: int | None = None,
                        extra: tuple[str, ...] = (), synchronous_acks: bool = False,
                        completion_window: float = 0.0, cpu: bool = False,
                        is_async: bool = False) -> Run:
    """``processes`` workers through ``n`` no-op jobs; ``batch=None`` is the default
    (adaptive) claim; ``synchronous_acks``: each ack waits for the WAL flush; ``cpu``: also
    the CPU of the workers and their PostgreSQL backends (``common.CpuMeter``);
    ``completion_window``: batched completion (``COMPLETION_WINDOW``); ``is_async``:
    ``async def`` no-op jobs (give ``extra`` an ``--async-concurrency``)."""
    from django_jobguard.conf import jobguard_settings

    env = child_env(JOBGUARD_BENCH_SYNCHRONOUS_ACKS="1" if synchronous_acks else "0",
                    JOBGUARD_BENCH_COMPLETION_WINDOW=str(completion_window))
    truncate(*JOBGUARD_TABLES)
    sizing = ("--batch", str(batch)) if batch else ()
    argv = django_command("jobworker", "--queue", "bench", "--sleep", "5", *sizing, *extra)
    if postgresql():
        per_process = 2 if jobguard_settings.USE_NOTIFY else 1  # queries + LISTEN

        def ready(procs: list) -> None:
            wait_for_connections(per_process * processes, procs)
    else:  # MariaDB: no application_name to count connections by; workers register a row

        def ready(procs: list) -> None:
            from django_jobguard.models import Worker

            wait_for(lambda: Worker.objects.count() >= processes, timeout=60,
                     what=f"{processes} workers registered")
    run = measure_processing(
        tool=f"jobguard (batch {batch or 'adaptive'})", processes=processes, jobs=n,
        start=lambda: spawn(argv, count=processes, env=env), ready=ready,
        fill=lambda count: jobguard_fill(count, is_async=is_async), remaining_sql=REMAINING,
        cpu=cpu, timeout=max(600, n / 25),
    )
    truncate(*JOBGUARD_TABLES)
    return run


def floor_processing(processes: int, n: int, *, batch: int = 1) -> Run:
    ensure_floor_table()
    argv = [sys.executable, "-m", "bench.floor", "--batch", str(batch), "--conninfo", conninfo()]

    def fill(count: int) -> None:
        with raw_connect() as conn:
            floor.insert_bulk(conn, count)

    return measure_processing(
        tool=f"raw SQL floor (batch {batch})", processes=processes, jobs=n,
        start=lambda: spawn(argv, count=processes),
        ready=lambda procs: wait_for_connections(processes, procs),
        fill=fill, remaining_sql=FLOOR_REMAINING,
    )


# -- the scenario ------------------------------------------------------------------------------


def run(*, smoke: bool) -> Report:
    n = sizes(smoke)
    report = Report(name="throughput")

    # The raw-SQL floor is psycopg: on MariaDB its columns stay empty.
    pg = postgresql()
    single = jobguard_dispatch_single(n["single"])
    floor_notify = floor_dispatch(n["single"], bulk=False, notify=True) if pg else None
    quiet = jobguard_dispatch_single(n["single"], notify=False)
    floor_single = floor_dispatch(n["single"], bulk=False) if pg else None
    bulk = jobguard_dispatch_bulk(n["bulk"])
    floor_bulk = floor_dispatch(n["bulk"], bulk=True) if pg else None
    if not pg:
        report.notes.append(f"on {vendor()}: no NOTIFY (workers poll at --sleep, and a commit "
                            f"wakes none), and no raw-SQL floor (it is written for psycopg)")
    report.tables.append(Table(
        title=f"Dispatch, jobs/s ({n['single']:,} single, {n['bulk']:,} bulk, "
              f"{database_name()})",
        columns=["how", "jobguard", "raw SQL floor", "floor is", "ratio"],
        rows=[["dispatch() one by one", single, floor_notify, "INSERT + NOTIFY per job",
               ratio(single, floor_notify)],
              ["dispatch() one by one, USE_NOTIFY=False", quiet, floor_single,
               "INSERT per job", ratio(quiet, floor_single)],
              ["dispatch_many()", bulk, floor_bulk, "INSERTs of 500 rows",
               ratio(bulk, floor_bulk)]],
    ))
    if pg:
        report.notes.append("dispatch() sends a NOTIFY with each job (in the same statement), "
                            "so its floor sends one too")
    report.data["dispatch"] = {"single": single, "single_without_notify": quiet, "bulk": bulk,
                               "floor_single_notify": floor_notify,
                               "floor_single": floor_single, "floor_bulk": floor_bulk}
    # The goals are PostgreSQL's: elsewhere the figures are reported, not judged.
    report.goals.append(Goal("bulk dispatch >= 20,000 jobs/s (PostgreSQL)", f"{bulk:,.0f}/s",
                             bulk >= 20_000 if pg else None))

    rows, runs = [], []
    batch = 10
    for processes in process_counts(smoke):
        jg = jobguard_processing(processes, n["process"], batch=1)
        jg_sync = jobguard_processing(processes, n["process"], batch=1, synchronous_acks=True)
        jg_batch = jobguard_processing(processes, n["process"], batch=batch)
        fl = floor_processing(processes, n["process"]) if pg else None
        fl_batch = floor_processing(processes, n["process"], batch=batch) if pg else None
        runs += [r for r in (jg, jg_sync, jg_batch, fl, fl_batch) if r is not None]
        fl_rate = fl.rate if fl else None
        fl_batch_rate = fl_batch.rate if fl_batch else None
        rows.append([processes, jg.rate, fl_rate, ratio(jg.rate, fl_rate),
                     jg_batch.rate, fl_batch_rate, ratio(jg_batch.rate, fl_batch_rate),
                     jg_sync.rate, ratio(jg_sync.rate, jg.rate)])
    report.tables.append(Table(
        title=f"Processing no-op jobs/s ({n['process']:,} jobs, {database_name()})",
        columns=["workers", "jobguard", "floor", "ratio", f"jobguard --batch {batch}",
                 f"floor batch {batch}", "ratio", "SYNCHRONOUS_ACKS=True", "× default"],
        rows=rows,
    ))
    report.notes.append("jobguard's acks (and the floor's DELETEs) commit without waiting for "
                        "the WAL flush by default; SYNCHRONOUS_ACKS=True waits (one fsync per "
                        "job), measured with --batch 1")
    report.data["processing"] = [vars(r) | {"rate": r.rate} for r in runs]
    top = rows[-1]
    if pg:
        report.goals.append(Goal(
            f"processing with {top[0]} workers >= 50-60% of the floor",
            f"{top[3]:.0%} (batch 1), {top[6]:.0%} (batch {batch})",
            top[3] >= 0.5 or top[6] >= 0.5))
    return report


def database_name() -> str:
    from django.db import connection

    return "PostgreSQL" if postgresql() else connection.display_name
