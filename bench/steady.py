"""Steady rate: jobs dispatched one at a time at a fixed offered rate (default 200 and 1,000
jobs/s, ``--rates``) for a while (default 20 s, ``--steady-seconds``) to one running worker
process; p50 / p99 / max of the dispatch → start latency, from just before the dispatch call
to the first line of the job, as each job records it (one ``RPUSH`` of ``started - sent`` to a
Redis list, off the database).

Tools: jobguard's default worker, ``--threads 20`` and ``--async-concurrency 20``; PgQueuer
(asyncpg, ``--batch-size`` as the burn-down's larger one), Oban (``burn:10``), procrastinate
(``--concurrency 1``), celery (``--pool prefork -c 1``, Redis broker) and django-tasks-db
(``db_worker``). Producer threads (default 4, each with its own connection; one for
procrastinate) pace the dispatches, the i-th due at i / rate s (open loop: a slow dispatch
delays that thread's next one, none is skipped), and the table shows the rate reached. A
tool whose worker cannot keep up with the offered rate has a queue that grows for the whole
period: its latencies then measure the backlog, and "started" says how many of the jobs began
within the drain time.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench import io_bound, peers
from bench.common import (
    LATENCY_KEY,
    Report,
    Table,
    django_command,
    dsn,
    knob,
    knob_list,
    percentile,
    spawn,
    stop,
    truncate,
    wait_for_connections,
    wanted,
)
from bench.throughput import JOBGUARD_TABLES
from tests.support.waiting import WaitTimeout, wait_for

CONCURRENCY = 20  # --threads / --async-concurrency


def rates(smoke: bool) -> list[float]:
    return [50.0, 200.0] if smoke else knob_list("RATES", [200.0, 1000.0])


def seconds(smoke: bool) -> float:
    return 1.5 if smoke else float(knob("STEADY_SECONDS", 20.0))


def producers() -> int:
    """Producer threads (``JOBGUARD_BENCH_STEADY_PRODUCERS``, default 4): one thread that
    waits for each commit reached only 350-570 of 1,000 jobs/s on the loaded 2-core VM."""
    return int(knob("STEADY_PRODUCERS", 4))


def pace(rate: float, duration: float, send: Callable[[], None], *, threads: int = 1,
         done: Callable[[], None] | None = None) -> tuple[int, float]:
    """Call ``send`` ``rate * duration`` times at ``rate`` per second, the i-th call due at
    ``i / rate`` s, from ``threads`` threads taking every ``threads``-th call each (``done``
    runs in each thread at its end, e.g. to close its database connection); (calls,
    seconds)."""
    count = max(int(rate * duration), 1)
    t0 = time.perf_counter() + 0.05
    errors: list[BaseException] = []

    def loop(first: int) -> None:
        try:
            for i in range(first, count, threads):
                pause = t0 + i / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                send()
        except BaseException as exc:  # raised in the caller's thread below
            errors.append(exc)
        finally:
            if done is not None:
                done()

    if threads == 1:
        loop(0)
    else:
        pool = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    if errors:
        raise RuntimeError(f"dispatching failed: {errors[0]!r}") from errors[0]
    return count, time.perf_counter() - t0


def close_django_connection() -> None:
    from django.db import connection

    connection.close()


def redis_client():
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL)


@dataclass
class Target:
    """One tool: how to start its worker, wait for it, and dispatch at a rate."""

    label: str
    start: Callable[[], list]
    ready: Callable[[list], None]
    produce: Callable[[float, float], tuple[int, float]]
    clean: Callable[[], None]
    unavailable: Callable[[], str | None] = lambda: None


# -- jobguard ----------------------------------------------------------------------------------


def jobguard(label: str, extra: tuple[str, ...], *, asynchronous: bool = False) -> Target:
    from bench.jobs import AsyncLatencyStamp, LatencyStamp
    from django_jobguard.conf import jobguard_settings

    job = AsyncLatencyStamp if asynchronous else LatencyStamp
    argv = django_command("jobworker", "--queue", "bench", "--sleep", "5", *extra)
    return Target(
        label=label,
        start=lambda: spawn(argv),
        ready=lambda procs: wait_for_connections(2 if jobguard_settings.USE_NOTIFY else 1,
                                                 procs),
        produce=lambda rate, secs: pace(rate, secs, lambda: job(sent=time.time()).dispatch(),
                                        threads=producers(), done=close_django_connection),
        clean=lambda: truncate(*JOBGUARD_TABLES),
        unavailable=lambda: ("this jobworker has no --threads"
                             if "--threads" in extra and not io_bound.threads_supported()
                             else None),
    )


# -- peers -------------------------------------------------------------------------------------


def pgqueuer() -> Target:
    batch = peers.pgqueuer_batch()

    async def send_all(rate: float, secs: float) -> tuple[int, float]:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        from bench.pgqueuer_app import STAMP

        tasks = producers()
        conns = [await asyncpg.connect(dsn()) for _ in range(tasks)]
        count = max(int(rate * secs), 1)
        t0 = time.perf_counter() + 0.05

        async def loop(first: int, queries: Queries) -> None:
            for i in range(first, count, tasks):
                pause = t0 + i / rate - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
                await queries.enqueue(STAMP, repr(time.time()).encode())

        try:
            await asyncio.gather(*(loop(k, Queries(AsyncpgDriver(conn)))
                                   for k, conn in enumerate(conns)))
            return count, time.perf_counter() - t0
        finally:
            for conn in conns:
                await conn.close()

    def start() -> list:
        peers.ensure_pgqueuer_schema()
        return spawn([sys.executable, "-m", "bench.pgqueuer_app", "--batch-size", str(batch)],
                     env=peers.pgqueuer_env())

    return Target(
        label=f"PgQueuer --batch-size {batch}", start=start,
        ready=lambda procs: peers.settle(procs, 1),
        produce=lambda rate, secs: asyncio.run(send_all(rate, secs)),
        clean=lambda: truncate(*peers.PGQUEUER_TABLES),
        unavailable=lambda: None if peers.installed("pgqueuer") else "not installed",
    )


def oban(smoke: bool) -> Target:
    venv_timeout = 240 if smoke else 900

    def start() -> list:
        bin_dir = peers.oban_venv(venv_timeout)
        peers.ensure_oban_schema(bin_dir)
        truncate(*peers.OBAN_TABLES)
        return spawn(peers.oban_argv(bin_dir), env=peers.oban_env())

    def produce(rate: float, secs: float) -> tuple[int, float]:
        out = peers.oban_client(peers.oban_venv(venv_timeout), "steady", repr(rate), repr(secs),
                                str(producers()))
        found = re.search(r"sent (\d+) in ([\d.]+)", out)
        if not found:
            raise RuntimeError(f"bench.oban_app steady said {out!r}")
        return int(found[1]), float(found[2])

    def unavailable() -> str | None:
        try:
            peers.oban_venv(venv_timeout)
        except peers.Unavailable as exc:
            return str(exc)
        return None

    return Target(label=f"Oban (burn:{peers.oban_limit()})", start=start,
                  ready=lambda procs: peers.oban_ready(procs, 1), produce=produce,
                  clean=lambda: truncate(*peers.OBAN_TABLES), unavailable=unavailable)


def procrastinate() -> Target:
    import os

    def start() -> list:
        peers.ensure_procrastinate_schema()
        return spawn([sys.executable, "-m", "procrastinate", "--app",
                      "bench.procrastinate_app.app", "worker", "--queues", "jgbench",
                      "--concurrency", "1"], env=peers.procrastinate_env())

    def produce(rate: float, secs: float) -> tuple[int, float]:
        os.environ["JOBGUARD_BENCH_CONNINFO"] = peers.conninfo()
        from bench.procrastinate_app import app, astamp

        with app.open():
            return pace(rate, secs, lambda: astamp.defer(sent=time.time()))

    return Target(label="procrastinate (--concurrency 1)", start=start,
                  ready=lambda procs: peers.settle(procs, 2), produce=produce,
                  clean=lambda: truncate(*peers.PROCRASTINATE_TABLES),
                  unavailable=lambda: None if peers.installed("procrastinate")
                  else "not installed")


def celery() -> Target:
    argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "--pool", "prefork", "-c", "1", "-Q", "jgbench", "--without-gossip",
            "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]

    def ready(procs: list) -> None:
        from bench.celery_app import app

        peers.celery_ready(app, procs)

    def produce(rate: float, secs: float) -> tuple[int, float]:
        from bench.celery_app import stamp

        return pace(rate, secs, lambda: stamp.apply_async(args=(time.time(),)),
                    threads=producers())

    def clean() -> None:
        from bench.celery_app import QUEUE, app

        app.connection_for_write().default_channel.client.delete(QUEUE)

    return Target(label="celery (redis, prefork -c 1)", start=lambda: spawn(argv),
                  ready=ready, produce=produce, clean=clean,
                  unavailable=lambda: None if peers.installed("celery") else "not installed")


def django_tasks_db() -> Target:
    def produce(rate: float, secs: float) -> tuple[int, float]:
        from bench.dtasks import stamp

        return pace(rate, secs, lambda: stamp.enqueue(time.time()), threads=producers(),
                    done=close_django_connection)

    return Target(label="django-tasks-db", start=lambda: spawn(django_command(
        "db_worker", "--interval", "0.05", "--no-startup-delay")),
        ready=lambda procs: peers.settle(procs, 1), produce=produce,
        clean=lambda: truncate(peers.DTASKS_TABLE),
        unavailable=lambda: None if peers.installed("django_tasks_db") else "not installed")


def targets(smoke: bool) -> list[Target]:
    return [
        jobguard("jobguard (default)", ()),
        jobguard(f"jobguard --threads {CONCURRENCY}", ("--threads", str(CONCURRENCY))),
        jobguard(f"jobguard --async-concurrency {CONCURRENCY}",
                 ("--async-concurrency", str(CONCURRENCY)), asynchronous=True),
        pgqueuer(), oban(smoke), procrastinate(), celery(), django_tasks_db(),
    ]


# -- the scenario ------------------------------------------------------------------------------


def collect(client, sent: int, drain: float) -> list[float]:
    """The latencies (ms) recorded for ``sent`` jobs, waiting up to ``drain`` seconds for
    the last ones to start."""
    try:
        wait_for(lambda: client.llen(LATENCY_KEY) >= sent, timeout=drain, interval=0.05,
                 what=f"{sent} latency samples")
    except WaitTimeout:
        pass  # reported as fewer started than sent
    return [float(x) * 1000 for x in client.lrange(LATENCY_KEY, 0, -1)]


def measure(target: Target, offered: list[float], duration: float,
            report: Report) -> list[list]:
    client = redis_client()
    drain = max(10.0, duration)
    rows = []
    target.clean()
    procs = target.start()
    try:
        target.ready(procs)
        # warm-up: the first jobs pay for imports and prepared statements
        client.delete(LATENCY_KEY)
        sent, _ = target.produce(min(offered), min(1.0, 20 / min(offered)))
        collect(client, sent, drain)
        for rate in offered:
            client.delete(LATENCY_KEY)
            sent, elapsed = target.produce(rate, duration)
            ms = collect(client, sent, drain)
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{target.label} worker exited with {proc.returncode}")
            achieved = sent / elapsed if elapsed else None
            if achieved and achieved < 0.95 * rate:
                report.notes.append(f"{target.label} at {rate:g}/s: the producer reached only "
                                    f"{achieved:,.0f}/s")
            if len(ms) < sent:
                report.notes.append(f"{target.label} at {rate:g}/s: {len(ms)} of {sent} jobs "
                                    f"started within {drain:.0f} s after the last dispatch "
                                    f"(the worker fell behind; latencies are of those)")
            rows.append([target.label, rate, achieved, f"{len(ms)}/{sent}",
                         percentile(ms, 50) if ms else None, percentile(ms, 99) if ms else None,
                         max(ms) if ms else None])
            report.data.setdefault("latency", {}).setdefault(target.label, {})[str(rate)] = {
                "sent": sent, "started": len(ms), "achieved_rate": achieved,
                "p50_ms": rows[-1][4], "p99_ms": rows[-1][5], "max_ms": rows[-1][6],
                "mean_ms": statistics.fmean(ms) if ms else None}
    finally:
        stop(procs)
        client.delete(LATENCY_KEY)
        target.clean()
    return rows


def run(*, smoke: bool) -> Report:
    offered, duration = rates(smoke), seconds(smoke)
    report = Report(name="steady")
    rows = []
    for target in targets(smoke):
        if not wanted(target.label):
            continue
        reason = target.unavailable()
        if reason:
            report.notes.append(f"{target.label}: skipped ({reason})")
            print(f"{target.label}: skipped ({reason})", flush=True)
            continue
        try:
            rows += measure(target, offered, duration, report)
        except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError,
                peers.Unavailable) as exc:
            report.notes.append(f"{target.label} failed: {exc}")
    report.tables.append(Table(
        title=f"Steady rate: dispatch -> start latency, ms, one worker process "
              f"({', '.join(f'{r:,.0f}' for r in offered)} jobs/s offered for {duration:g} s)",
        columns=["tool", "offered/s", "dispatched/s", "started", "p50", "p99", "max"],
        rows=rows))
    report.data["settings"] = {"rates": offered, "seconds": duration, "producers": producers(),
                               "pgqueuer_batch": peers.pgqueuer_batch(),
                               "oban_limit": peers.oban_limit()}
    if smoke:
        report.notes.append(f"smoke: {duration:g} s per rate; the figures mean little")
    return report
