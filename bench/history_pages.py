"""The finished-run history's pages with a million runs (issue 31).

Fills PostgreSQL with N finished runs (1,000,000; 20,000 with ``--smoke``) of 20 job classes
over three queues, spread over the last 7 days (one run in 50 failed, one in 10 tagged), and
VACUUM ANALYZE, as autovacuum would. Then times, as a logged-in superuser through Django's test
client (median of 5): the admin's *Finished runs* list (first page, filtered by job name,
by state, searched by job id and by job name), ``GET runs/`` (first page and filtered by name
and time range), ``GET runs/statistics/`` (per class and queue over 24 h and 7 d) and the
admin dashboard, which shows those statistics. Goal: every page under 200 ms. The runs are
written with SQL, then their run statistics built (``history.rebuild_statistics()``) and
the minute rows older than two days pruned, as the workers' inserts and housekeeping would.
It runs in a child process with the test project's settings, on its own database
``jobguard_bench_history_pages``, made anew each run.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "jobguard_bench_history_pages"
GOAL_MS = 200.0
CLASSES = 20


def run(*, smoke: bool):
    """The ``history_pages`` scenario for bench/run.py."""
    from bench.common import Goal, Report, Table

    count = 20_000 if smoke else 1_000_000
    env = dict(os.environ)
    env.pop("JOBGUARD_REDIS_URL", None)
    env.update({
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "JOBGUARD_TEST_DATABASE_URL": f"postgres://127.0.0.1:5432/{DATABASE}",
        "JOBGUARD_HISTORY": "all",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
    })
    out = subprocess.run([sys.executable, __file__, "--child", str(count)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"history_pages child failed:\n{out.stderr[-3000:]}")
    timings = json.loads(out.stdout.strip().splitlines()[-1])
    report = Report(name="history_pages")
    report.tables.append(Table(
        title=f"History pages with {count:,} finished runs, PostgreSQL (median of 5, ms)",
        columns=["request", "ms"], rows=[[name, value] for name, value in timings.items()]))
    for name, value in timings.items():
        report.goals.append(Goal(goal=f"{name} under {GOAL_MS:g} ms", value=f"{value:.1f} ms",
                                 met=None if smoke else value < GOAL_MS))
    report.data = {"timings": timings, "runs": count}
    return report


# -- the child process -----------------------------------------------------------------------


def _fill(count: int) -> None:
    from django.db import connection, connections

    from django_jobguard import history
    from django_jobguard.models import FinishedRun, RunStatistic

    table = FinishedRun._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO {table} (job_id, state, name, queue, arguments, attempt, worker,
                                 started_at, finished_at, runtime, wait, result_size, error,
                                 tags)
            SELECT gen_random_uuid(),
                   CASE WHEN g %% 50 = 0 THEN 'FAILED' ELSE 'DONE' END,
                   'bench.Job' || (g %% {CLASSES}),
                   CASE WHEN g %% 10 < 6 THEN 'default' WHEN g %% 10 < 9 THEN 'emails'
                        ELSE 'reports' END,
                   jsonb_build_object('args', jsonb_build_array(g), 'kwargs', '{{}}'::jsonb),
                   1, 'bench:1:' || (g %% 4),
                   now() - ((g * 604800.0 / %s) || ' s')::interval - interval '20 ms',
                   now() - ((g * 604800.0 / %s) || ' s')::interval,
                   0.02, 0.005, NULL,
                   CASE WHEN g %% 50 = 0 THEN 'ValueError: boom' ELSE '' END,
                   CASE WHEN g %% 10 = 0 THEN ',urgent,' ELSE '' END
            FROM generate_series(1, %s) g""", [count, count, count])
    # The per-minute and per-hour statistics the workers' inserts would have added (one
    # aggregate statement, as the migration that introduced them does).
    history.rebuild_statistics()
    history.prune_statistics()  # as housekeeping does: minute rows kept two days
    connection.close()
    with connections["default"].cursor() as cursor:  # autocommit: VACUUM needs it
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute(f"VACUUM ANALYZE {RunStatistic._meta.db_table}")


def _measure() -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone

    from bench.dashboard import median_ms
    from django_jobguard.models import FinishedRun

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    admin, api = "/admin/django_jobguard/finishedrun/", "/jobguard/api/runs/"
    hour_ago = (timezone.now() - datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    some = FinishedRun.objects.order_by("-finished_at").values_list("job_id", flat=True)[500]

    def get(url: str):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        return response

    pages = {
        "admin: Finished runs, first page": admin,
        "admin: Finished runs, one job class": f"{admin}?name=bench.Job7",
        "admin: Finished runs, failed": f"{admin}?state__exact=FAILED",
        "admin: Finished runs, search by job id": f"{admin}?q={some}",
        "admin: Finished runs, search by job name": f"{admin}?q=bench.Job7",
        "API: GET runs/": api,
        "API: GET runs/ by name and the last hour": f"{api}?name=bench.Job7&since={hour_ago}",
        "API: GET runs/statistics/": f"{api}statistics/",
        "API: GET runs/statistics/?window=7d": f"{api}statistics/?window=7d",
        "admin: dashboard (per-class statistics)": "/admin/django_jobguard/dashboard/",
    }
    timings = {}
    for label, url in pages.items():
        try:
            timings[label] = median_ms(lambda url=url: get(url))
        except AssertionError as exc:  # a filter this version does not take: say so
            print(f"{label}: {exc}", file=sys.stderr)
    return timings


def child(count: int) -> None:
    from bench.dashboard import create_database, migrate_child

    create_database(DATABASE)
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
