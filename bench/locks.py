"""Per-job cost of each guard (``ShouldBeUnique``, ``WithoutOverlapping``, ``RateLimited``,
``ThrottlesExceptions``) against the same job without it, with the database store and the Redis
store, on PostgreSQL (or MariaDB: ``bench/run.py --database mysql://...``), in one run.

Each job is dispatched one by one and run through an in-process worker's pipeline; "ms/job"
covers both (a unique job takes its lock at dispatch and frees it at ack; an overlap job takes
and frees its lock around ``handle()``). The three jobs run in short blocks, interleaved in
rotating order, and the overhead is the median of the per-block differences to the plain
job's block next to it, so a burst of load from other processes hits all of them alike.
"client CPU" is this process's CPU time per job (``time.process_time``): the Python side of
the overhead, which load from other processes barely changes; wall-clock overhead adds the
extra round trips (2 per job for either lock, a transaction for a rate limit, 1-2 for a
circuit), each of which waits for a CPU when the machine is busy.

Standalone::

    JOBGUARD_BENCH_DATABASE_URL=postgres://127.0.0.1:5432/jobguard_bench \\
    JOBGUARD_BENCH_REDIS_URL=redis://127.0.0.1:6379/0 python bench/locks.py [--smoke]

or as the ``locks`` scenario of ``bench/run.py``. Targets: overhead <= 0.5 ms/job on Redis,
<= 2 ms/job on the database store.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS_MS = {"redis": 0.5, "database": 2.0}
VARIANTS = ("plain", "unique", "overlap", "rate_limited", "throttled")
STORES = ("database", "redis")
REDIS_CACHE = "jobguard_bench_locks"


def _configure_standalone() -> None:
    """Django settings for running this file directly (the bench runner brings its own)."""
    for path in (str(ROOT), str(ROOT / "testproject")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django
    from django.conf import settings

    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        from testproject.settings import database_from_url

        url = os.environ.get("JOBGUARD_BENCH_DATABASE_URL",
                             "postgres://127.0.0.1:5432/jobguard_bench")
        settings.configure(
            SECRET_KEY="bench", USE_TZ=True, TIME_ZONE="UTC",
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
            INSTALLED_APPS=["django.contrib.contenttypes", "django_jobguard"],
            DATABASES={"default": database_from_url(url)},
            REDIS_URL=os.environ.get("JOBGUARD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
            LOGGING_CONFIG=None,
        )
    django.setup()


def _redis_settings() -> tuple[dict, dict]:
    """CACHES and JOBGUARD with a django-redis cache for the Redis store."""
    from django.conf import settings

    url = getattr(settings, "REDIS_URL", "") or os.environ.get(
        "JOBGUARD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    caches = {**settings.CACHES, REDIS_CACHE: {"BACKEND": "django_redis.cache.RedisCache",
                                               "LOCATION": url}}
    jobguard = dict(getattr(settings, "JOBGUARD", {}))
    jobguard["STORES"] = {
        "database": {"BACKEND": "django_jobguard.stores.database.DatabaseStore"},
        "redis": {"BACKEND": "django_jobguard.stores.redis.RedisStore", "CACHE": REDIS_CACHE},
    }
    return caches, jobguard


def _job_classes() -> dict[str, Any]:
    from django_jobguard import (
        Job,
        Limit,
        RateLimited,
        ShouldBeUnique,
        ThrottlesExceptions,
        WithoutOverlapping,
        rate_limiter,
    )

    # Never over the limit: what is measured is the counting, not the deferral.
    rate_limiter.define("bench-locks", lambda job: Limit.per_minute(10**9).by(job.n % 100))

    class Plain(Job):
        name = "bench.locks.Plain"
        queue = "bench-locks"

        def __init__(self, n: int):
            self.n = n

        def handle(self) -> None:
            return None

    class Unique(ShouldBeUnique, Plain):
        name = "bench.locks.Unique"

        def unique_id(self) -> str:
            return str(self.n)

    class Overlap(Plain):
        name = "bench.locks.Overlap"

        def middleware(self) -> list:
            return [WithoutOverlapping(self.n % 100, expire_after=60)]

    class Limited(Plain):
        name = "bench.locks.RateLimited"

        def middleware(self) -> list:
            return [RateLimited("bench-locks")]

    class Throttled(Plain):
        name = "bench.locks.Throttled"

        def middleware(self) -> list:
            return [ThrottlesExceptions(10, 600).by(f"bench:{self.n % 100}")]

    return {"plain": Plain, "unique": Unique, "overlap": Overlap, "rate_limited": Limited,
            "throttled": Throttled}


def _reset(store_alias: str) -> None:
    from django_jobguard.models import Lock, QueuedJob, Throttle
    from django_jobguard.stores import get_store

    QueuedJob.objects.filter(queue="bench-locks")._raw_delete("default")
    Lock.objects.filter(key__startswith="jobguard:")._raw_delete("default")
    Throttle.objects.filter(key__startswith="jobguard:")._raw_delete("default")
    if store_alias == "redis":
        client = get_store("redis").client
        for key in client.scan_iter(match="jobguard:*", count=1000):
            client.delete(key)


def _block(job_class: type, first: int, jobs: int, worker: Any) -> tuple[float, float, float]:
    """Dispatch ``jobs`` jobs one by one, then run them through the worker's pipeline
    (claim, middleware, handle, ack); (dispatch s, processing s, this process's CPU s)."""
    from django_jobguard import queue

    cpu = time.process_time()
    t0 = time.perf_counter()
    for n in range(first, first + jobs):
        assert job_class(n).dispatch()
    t1 = time.perf_counter()
    done = 0
    while rows := queue.claim(["bench-locks"], worker_id=worker.id, limit=1):
        for row in rows:
            worker.process_claimed(row)
            done += 1
    t2 = time.perf_counter()
    assert done == jobs, done
    return t1 - t0, t2 - t1, time.process_time() - cpu


def measure(*, blocks: int, jobs: int) -> dict[tuple[str, str], dict[str, float]]:
    """ms per job for every (store, variant): medians over ``blocks`` blocks of ``jobs`` jobs,
    the variants interleaved in rotating order; overhead = median of the per-block
    differences to the plain job's block next to it (so load bursts cancel out)."""
    from django.test import override_settings

    from django_jobguard.worker import Worker, WorkerOptions

    caches, jobguard = _redis_settings()
    jobguard["USE_NOTIFY"] = False  # the same for every variant; only adds noise
    classes = _job_classes()
    worker = Worker(WorkerOptions(queues=["bench-locks"], memory=0))
    samples: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with override_settings(CACHES=caches):
        for store_alias in STORES:
            with override_settings(JOBGUARD={**jobguard, "STORE": store_alias}):
                _reset(store_alias)
                _block(classes["plain"], 0, jobs, worker)  # warm up connections and caches
        for index in range(blocks):
            for store_alias in STORES if index % 2 else STORES[::-1]:
                with override_settings(JOBGUARD={**jobguard, "STORE": store_alias}):
                    shift = index % len(VARIANTS)
                    for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                        samples.setdefault((store_alias, variant), []).append(
                            _block(classes[variant], (index + 1) * jobs, jobs, worker))
        for store_alias in STORES:
            with override_settings(JOBGUARD={**jobguard, "STORE": store_alias}):
                _reset(store_alias)
    out = {}
    for (store_alias, variant), runs in samples.items():
        plain = samples[(store_alias, "plain")]
        out[(store_alias, variant)] = {
            "dispatch_ms": statistics.median(d for d, _, _ in runs) * 1000 / jobs,
            "process_ms": statistics.median(p for _, p, _ in runs) * 1000 / jobs,
            "total_ms": statistics.median(d + p for d, p, _ in runs) * 1000 / jobs,
            "overhead_ms": statistics.median(
                (d + p) - (pd + pp) for (d, p, _), (pd, pp, _) in zip(runs, plain, strict=True)
            ) * 1000 / jobs,
            "cpu_ms": statistics.median(c for _, _, c in runs) * 1000 / jobs,
            "cpu_overhead_ms": statistics.median(
                c - pc for (_, _, c), (_, _, pc) in zip(runs, plain, strict=True)) * 1000 / jobs,
        }
    return out


def primitives(*, pairs: int, blocks: int) -> dict[str, dict[str, float]]:
    """ms per bare round trip (``SELECT 1`` / ``PING``) and per acquire+release pair, per
    store: the floor under the per-job overhead on this machine right now."""
    from django.db import connection
    from django.test import override_settings

    from django_jobguard.stores import get_store

    caches, jobguard = _redis_settings()
    samples: dict[tuple[str, str], list[float]] = {}
    with override_settings(CACHES=caches, JOBGUARD=jobguard):
        stores = {alias: get_store(alias) for alias in STORES}
        ping = {"database": lambda: connection.cursor().execute("SELECT 1"),
                "redis": lambda: stores["redis"].client.ping()}
        for index in range(blocks):
            for alias, store in stores.items():
                t0 = time.perf_counter()
                for _ in range(pairs):
                    ping[alias]()
                t1 = time.perf_counter()
                for n in range(pairs):
                    key = f"jobguard:overlap:bench:{n % 100}"
                    store.release(key, str(index)) if store.acquire(key, str(index)) else None
                t2 = time.perf_counter()
                samples.setdefault((alias, "round_trip"), []).append((t1 - t0) / pairs)
                samples.setdefault((alias, "pair"), []).append((t2 - t1) / pairs)
        for alias in STORES:
            with override_settings(JOBGUARD={**jobguard, "STORE": alias}):
                _reset(alias)
    return {alias: {what: statistics.median(samples[(alias, what)]) * 1000
                    for what in ("round_trip", "pair")} for alias in STORES}


def report_rows(results: dict) -> tuple[list[list[Any]], list[tuple[str, str, float, bool]]]:
    rows, goals = [], []
    for store_alias in STORES:
        plain = results[(store_alias, "plain")]["total_ms"]
        for variant in VARIANTS:
            r = results[(store_alias, variant)]
            overhead = r["overhead_ms"]
            rows.append([store_alias, variant, r["dispatch_ms"], r["process_ms"], r["total_ms"],
                         None if variant == "plain" else overhead,
                         None if variant == "plain" else (plain + overhead) / plain,
                         r["cpu_ms"], None if variant == "plain" else r["cpu_overhead_ms"]])
            if variant != "plain":
                target = TARGETS_MS[store_alias]
                goals.append((store_alias, variant, overhead, overhead <= target))
    return rows, goals


COLUMNS = ["store", "job", "dispatch ms/job", "process ms/job", "total ms/job",
           "overhead ms/job", "x plain", "client CPU ms/job", "CPU overhead"]


def run(*, smoke: bool) -> Any:
    """The ``locks`` scenario for bench/run.py."""
    from bench.common import Goal, Report, Table

    blocks, jobs = (6, 50) if smoke else (30, 100)
    results = measure(blocks=blocks, jobs=jobs)
    rows, goals = report_rows(results)
    from django.db import connection

    report = Report(name="locks")
    on = "PostgreSQL" if connection.vendor == "postgresql" else connection.display_name
    report.tables.append(Table(title=f"Guard overhead per job on {on} (median of {blocks} "
                                     f"interleaved blocks of {jobs} jobs)", columns=COLUMNS,
                               rows=rows))
    report.notes.append("overhead = median of per-block differences to the plain job's block "
                        "run next to it; includes dispatch and processing")
    floor = primitives(pairs=200, blocks=3 if smoke else 10)
    report.tables.append(Table(title="Reference: one round trip and one acquire+release pair",
                               columns=["store", "round trip ms", "acquire+release ms"],
                               rows=[[a, f["round_trip"], f["pair"]] for a, f in floor.items()]))
    for store_alias, variant, overhead, met in goals:
        target = TARGETS_MS[store_alias]
        report.goals.append(Goal(goal=f"{variant} overhead on the {store_alias} store <= "
                                      f"{target} ms/job", value=f"{overhead:.3f} ms/job",
                                 met=None if smoke else met))
    report.data = {f"{s}/{v}": r for (s, v), r in results.items()}
    report.data["primitives"] = floor
    return report


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="6 blocks of 50 jobs")
    parser.add_argument("--blocks", type=int, default=None, help="blocks per job (default 30)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per block (default 100)")
    args = parser.parse_args(argv)
    _configure_standalone()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        print(f"warning: the database is {connection.vendor}, not PostgreSQL", file=sys.stderr)
    call_command("migrate", verbosity=0)
    blocks = args.blocks or (6 if args.smoke else 30)
    jobs = args.jobs or (50 if args.smoke else 100)
    results = measure(blocks=blocks, jobs=jobs)
    rows, goals = report_rows(results)
    cells = [COLUMNS] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"Guard overhead per job on PostgreSQL: median of {blocks} interleaved blocks of "
          f"{jobs} jobs; {os.cpu_count()} CPUs, load average {load}")
    for index, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if index == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    floor = primitives(pairs=200, blocks=3 if args.smoke else 10)
    print("reference (this machine, now): " + "; ".join(
        f"{alias}: round trip {f['round_trip']:.3f} ms, acquire+release {f['pair']:.3f} ms"
        for alias, f in floor.items()))
    for store_alias, variant, overhead, met in goals:
        print(f"goal: {variant} on {store_alias} <= {TARGETS_MS[store_alias]} ms/job: "
              f"{overhead:.3f} ms/job [{'met' if met else 'MISSED'}]")
    return 0 if all(met for *_, met in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
