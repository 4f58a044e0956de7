"""The admin's lock page and the API's lock list with many locks held (issue 12 item 7).

With 50,000 locks the old page read and rendered every lock (11 s and 46 MB of HTML on the
database store, 15 s on Redis) and ``locks/{key}/`` scanned the whole store. Pages are now
keyed (a keyset on the key index in SQL, SCAN in Redis) and one key is looked up directly.
This scenario fills both stores with N locks (100,000; 5,000 with ``--smoke``) and times, on
PostgreSQL, as a logged-in superuser through Django's test client:

- the admin lock page: first page, a page further on (its "next" link), narrowed by kind and
  key prefix, and a key typed in full;
- the API: ``GET locks/`` (first page), ``GET locks/{key}/``;
- the baseline, in the same run: reading every lock with its stale verdict
  (``operations.inspect_locks``), which is what the page did before, without the rendering.

Each figure is the median of 5 requests. Goal: every page under 200 ms at 100,000 locks.
It runs in a child process with the test project's settings (the admin and DRF installed),
on its own database ``jobguard_bench_pages`` and Redis database 7 (flushed).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "jobguard_bench_pages"
REDIS_DB = 7
GOAL_MS = 200.0
STORES = ("database", "redis")


def run(*, smoke: bool):
    """The ``lock_pages`` scenario for bench/run.py."""
    from bench.common import Goal, Report, Table

    count = 5_000 if smoke else 100_000
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "JOBGUARD_TEST_DATABASE_URL": f"postgres://127.0.0.1:5432/{DATABASE}",
        "JOBGUARD_REDIS_URL": f"redis://127.0.0.1:6379/{REDIS_DB}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
    })
    out = subprocess.run([sys.executable, __file__, "--child", str(count)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"lock_pages child failed:\n{out.stderr[-3000:]}")
    results = json.loads(out.stdout.strip().splitlines()[-1])
    report = Report(name="lock_pages")
    table = Table(title=f"Lock pages with {count:,} locks held, PostgreSQL (median of 5, ms)",
                  columns=["request", *STORES])
    names = list(results["database"])
    for name in names:
        table.rows.append([name, *(results[s][name] for s in STORES)])
    report.tables.append(table)
    for store in STORES:
        base = results[store]["baseline: every lock with its verdict"]
        for name in names:
            if name.startswith("baseline"):
                continue
            value = results[store][name]
            report.goals.append(Goal(goal=f"{store}: {name} under {GOAL_MS:g} ms",
                                     value=f"{value:.1f} ms ({base / value:.0f}x faster than "
                                           f"the baseline)",
                                     met=None if smoke else value < GOAL_MS))
    report.notes.append("baseline = operations.inspect_locks() over the whole store, the "
                        "read the page did before keyed pages (its rendering came on top)")
    report.data = results
    return report


# -- the child process -----------------------------------------------------------------------


def _create_database() -> None:
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 dbname=postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            [DATABASE]).fetchone():
            conn.execute(f'CREATE DATABASE "{DATABASE}"')


def _key(i: int) -> str:
    kind = "overlap" if i % 3 == 0 else "unique"
    return f"jobguard:{kind}:bench.Page:{i:07d}"


def _fill(count: int) -> None:
    """``count`` locks in each store: two thirds unique, one third overlap."""
    from django.utils import timezone
    from django_redis import get_redis_connection

    from django_jobguard.models import Lock

    Lock.objects.all().delete()
    now = timezone.now()
    Lock.objects.bulk_create([Lock(key=_key(i), owner=f"o{i}", token=i + 1, acquired_at=now,
                                   job_id="") for i in range(count)], batch_size=5000)
    from django.db import connection

    with connection.cursor() as cursor:  # as autovacuum would: the planner sees the rows
        cursor.execute("ANALYZE django_jobguard_lock")
    client = get_redis_connection("default")
    client.flushdb()
    micros = str(int(time.time() * 1_000_000))
    for start in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + 5000, count)):
            pipe.hset(_key(i), mapping={"owner": f"o{i}", "token": str(i + 1),
                                       "acquired_at": micros, "job_id": ""})
            pipe.set(f"{_key(i)}:fence", str(i + 1))
        pipe.execute()


def _median_ms(fn, times: int = 5) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        fn()
        spent.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(spent), 1)


def _measure(count: int) -> dict[str, dict[str, float]]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_jobguard import operations
    from django_jobguard.stores import get_store

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    locks, api = "/admin/django_jobguard/lock/", "/jobguard/api/locks/"
    middle = _key(count // 2 + (count // 2 % 3 == 0))  # a unique lock halfway

    def get(url: str, params: dict | None = None):
        response = client.get(url, params or {})
        assert response.status_code == 200, (url, response.status_code)
        return response

    results: dict[str, dict[str, float]] = {}
    for alias in STORES:
        first = get(locks, {"store": alias})
        assert len(first.context["rows"]) >= 100, "the page did not fill"
        further = locks + first.context["next_url"]
        for _ in range(20):  # a page further on
            further = locks + get(further).context["next_url"]
        results[alias] = {
            "admin: first page": _median_ms(lambda a=alias: get(locks, {"store": a})),
            "admin: page 21 (next link)": _median_ms(lambda u=further: get(u)),
            "admin: kind=overlap, prefix": _median_ms(lambda a=alias: get(
                locks, {"store": a, "kind": "overlap", "q": "bench.Page:00"})),
            "admin: one key typed in full": _median_ms(lambda a=alias: get(
                locks, {"store": a, "q": middle})),
            "API: GET locks/": _median_ms(lambda a=alias: get(api, {"store": a})),
            "API: GET locks/{key}/": _median_ms(lambda a=alias: get(
                f"{api}{middle}/", {"store": a})),
            "baseline: every lock with its verdict": _median_ms(
                lambda a=alias: operations.inspect_locks(get_store(a)), times=1),
        }
    return results


def child(count: int) -> None:
    _create_database()
    import django
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    django.setup()
    setup_test_environment()  # the test client's host is allowed
    call_command("migrate", verbosity=0)
    _fill(count)
    print(json.dumps(_measure(count)), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]))
    else:
        sys.path.insert(0, str(ROOT))
        from bench import common

        common.setup_django()
        common.print_report(run(smoke="--smoke" in sys.argv))
