"""The admin's dashboard and ``GET stats/history/`` with a million waiting jobs (issue 14).

Fills PostgreSQL with N waiting jobs (1,000,000; 20,000 with ``--smoke``) over three queues
and two priorities, plus 1,000 delayed and 200 running jobs, 500 failed jobs, a day of
per-minute history for each queue and four live workers; VACUUM ANALYZE, as autovacuum would.
Then times, as a logged-in superuser through Django's test client (median of 5):

- the admin dashboard page (rendered, with its charts);
- ``GET stats/history/`` (the same data as JSON);
- the page's per-queue counts alone (``monitoring.queue_overview()``) against the baseline,
  in the same run: ``operations.queue_stats()``, the exact per-queue counts of ``stats/``
  and ``jobs_monitor`` (one GROUP BY over every row).

The dashboard counts each state exactly up to 10,000 jobs on ranges of the claim index and
takes PostgreSQL's estimate above that, so its cost follows the number of queues and
priorities, not of rows. Goal: the page under 200 ms at 1,000,000 waiting jobs.
It runs in a child process with the test project's settings, on its own database
``jobguard_bench_dashboard``, made anew each run (no Redis: the database store).
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
DATABASE = "jobguard_bench_dashboard"
GOAL_MS = 200.0
QUEUES = ("default", "emails", "reports")


def run(*, smoke: bool):
    """The ``dashboard`` scenario for bench/run.py."""
    from bench.common import Goal, Report, Table

    count = 20_000 if smoke else 1_000_000
    env = dict(os.environ)
    env.pop("JOBGUARD_REDIS_URL", None)
    env.update({
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "JOBGUARD_TEST_DATABASE_URL": f"postgres://127.0.0.1:5432/{DATABASE}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
    })
    out = subprocess.run([sys.executable, __file__, "--child", str(count)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"dashboard child failed:\n{out.stderr[-3000:]}")
    results = json.loads(out.stdout.strip().splitlines()[-1])
    report = Report(name="dashboard")
    table = Table(title=f"Dashboard with {count:,} waiting jobs, PostgreSQL (median of 5, ms)",
                  columns=["request", "ms"])
    for name, value in results["timings"].items():
        table.rows.append([name, value])
    report.tables.append(table)
    base = results["timings"]["baseline: queue_stats() exact GROUP BY"]
    counts = results["timings"]["queue counts only: monitoring.queue_overview()"]
    report.goals.append(Goal(goal="queue counts faster than the exact GROUP BY",
                             value=f"{counts:.1f} ms vs {base:.1f} ms "
                                   f"({base / counts:.1f}x)",
                             met=None if smoke else counts < base))
    for name in ("admin: dashboard page", "API: GET stats/history/"):
        value = results["timings"][name]
        report.goals.append(Goal(goal=f"{name} under {GOAL_MS:g} ms",
                                 value=f"{value:.1f} ms (baseline {base:.1f} ms)",
                                 met=None if smoke else value < GOAL_MS))
    errors = {q: round(100 * (shown - results["exact_waiting"][q])
                       / max(results["exact_waiting"][q], 1), 1)
              for q, shown in results["waiting"].items()}
    report.notes.append(f"waiting counts shown: {results['waiting']} (estimated: "
                        f"{results['estimated']}; off the exact count by {errors} %)")
    report.data = results
    return report


# -- the child process -----------------------------------------------------------------------


def create_database(name: str = DATABASE) -> None:
    """The scenario's database, made anew each run (a schema left by an older checkout, with
    other migration names, cannot get in the way)."""
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def migrate_child() -> None:
    """In the child process: Django set up for the test client, the database migrated."""
    import django
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    django.setup()
    setup_test_environment()  # the test client's host is allowed
    call_command("migrate", verbosity=0)


def _fill(count: int) -> None:
    from django.db import connection

    from django_jobguard import history
    from django_jobguard.models import FailedJob, QueuedJob, QueueMinute, Worker

    QueuedJob.objects.all()._raw_delete("default")
    FailedJob.objects.all().delete()
    QueueMinute.objects.all().delete()
    Worker.objects.all().delete()
    table = QueuedJob._meta.db_table
    columns = ("id, queue, name, payload, attempts, exceptions, priority, available_at, "
               "reserved_at, reserved_by, last_error, wait_reason, created_at, "
               "progress_message")
    with connection.cursor() as cursor:
        # Waiting: three queues (60/30/10 %), two priorities, due over the last hours.
        cursor.execute(f"""
            INSERT INTO {table} ({columns})
            SELECT gen_random_uuid(),
                   CASE WHEN g %% 10 < 6 THEN 'default' WHEN g %% 10 < 9 THEN 'emails'
                        ELSE 'reports' END,
                   'bench.Noop', '{{}}', 0, 0, CASE WHEN g %% 7 = 0 THEN 5 ELSE 0 END,
                   now() - (g || ' ms')::interval, NULL, '', '', '', now(), ''
            FROM generate_series(1, %s) g""", [count])
        # Delayed (1,000) and running (200, leased for a minute).
        cursor.execute(f"""
            INSERT INTO {table} ({columns})
            SELECT gen_random_uuid(), 'default', 'bench.Noop', '{{}}', 0, 0, 0,
                   now() + interval '1 hour', NULL, '', '', '', now(), ''
            FROM generate_series(1, 1000) g""")
        cursor.execute(f"""
            INSERT INTO {table} ({columns})
            SELECT gen_random_uuid(), 'emails', 'bench.Noop', '{{}}', 1, 0, 0,
                   now() + interval '1 minute', now(), 'bench:1:' || (g % 4), '', '', now(), ''
            FROM generate_series(1, 200) g""")
    FailedJob.objects.bulk_create([FailedJob(queue=QUEUES[i % 3], name="bench.Boom",
                                             exception_class="ValueError")
                                   for i in range(500)])
    minute = history.current_minute()
    import datetime

    for back in range(24 * 60):
        history.add_counts({q: (100 + back % 37 + i * 20, back % 5) for i, q in
                            enumerate(QUEUES)}, minute=minute - datetime.timedelta(minutes=back))
    for n in range(4):
        Worker.objects.create(id=f"bench:1:{n}", hostname="bench-host", pid=1,
                              queues=",".join(QUEUES), current_job="")
    connection.close()
    from django.db import connections

    with connections["default"].cursor() as cursor:  # autocommit: VACUUM needs it
        cursor.execute(f"VACUUM ANALYZE {table}")


def median_ms(fn, times: int = 5) -> float:
    fn()  # warm: the first request loads templates and URL patterns
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        fn()
        spent.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(spent), 1)


def _measure() -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_jobguard import operations
    from django_jobguard.operations import monitoring

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    page, api = "/admin/django_jobguard/dashboard/", "/jobguard/api/stats/history/"

    def get(url: str):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        return response

    data = get(api).json()
    timings = {
        "admin: dashboard page": median_ms(lambda: get(page)),
        "API: GET stats/history/": median_ms(lambda: get(api)),
        "queue counts only: monitoring.queue_overview()": median_ms(
            monitoring.queue_overview),
        "baseline: queue_stats() exact GROUP BY": median_ms(operations.queue_stats),
    }
    exact = operations.queue_stats()
    return {"timings": timings,
            "waiting": {q: c["waiting"] for q, c in data["queues"].items()},
            "exact_waiting": {q: c["waiting"] for q, c in exact.items()},
            "estimated": {q: c["estimated"] for q, c in data["queues"].items()}}


def child(count: int) -> None:
    create_database()
    migrate_child()
    _fill(count)
    print(json.dumps(_measure()), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]))
    else:
        sys.path.insert(0, str(ROOT))
        from bench import common

        common.setup_django()
        common.print_report(run(smoke="--smoke" in sys.argv))
