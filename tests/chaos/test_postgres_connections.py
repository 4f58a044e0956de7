"""``pg_terminate_backend`` on the workers' connections while they claim and run jobs.

Every connection a worker has is cut over and over: the claim connection (mid-claim), the
same connection while ``handle()`` writes (mid-job), the LISTEN connection and the heartbeat.
The workers must stay up, reconnect, and finish every job: none lost, none left reserved
beyond RETRY_AFTER, and each one LISTENs again afterwards.
"""

from __future__ import annotations

import threading
import time

import pytest
from demo.models import JobRun
from django.db import connection

from django_jobguard import dispatch_many
from django_jobguard.models import QueuedJob
from tests.chaos.conftest import Outcome, chaos_env
from tests.support import jobs, requires_postgres, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True),
              requires_postgres]

APP = "jobguard-chaos-worker"


def _worker_backends(cursor, *, listening: bool = False) -> list[int]:
    sql = ("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
           "AND datname = current_database() AND pid <> pg_backend_pid()")
    if listening:
        sql += " AND query ILIKE 'LISTEN%%'"
    cursor.execute(sql, [APP])
    return [row[0] for row in cursor.fetchall()]


def test_terminated_connections_mid_claim_and_mid_job_lose_nothing(fleet, tmp_path):
    total = 400
    handles = dispatch_many([jobs.Record("pgkill", key=str(i), seconds=0.005)
                             for i in range(total)])
    workers = fleet("--sleep", "0.2", "--tries", "10", env=chaos_env(PGAPPNAME=APP))
    procs = workers.start(2)
    terminated: list[int] = []
    done = threading.Event()

    def terminator() -> None:
        import psycopg

        params = connection.get_connection_params()
        with psycopg.connect(dbname=params["dbname"], user=params.get("user"),
                             host=params.get("host"), port=params.get("port"),
                             password=params.get("password"), autocommit=True) as conn:
            cursor = conn.cursor()
            while not done.is_set() and len(terminated) < 12:
                for pid in _worker_backends(cursor):
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                    terminated.append(pid)
                time.sleep(0.25)

    wait_for(lambda: JobRun.objects.filter(label="pgkill").count() >= 20, timeout=60)
    thread = threading.Thread(target=terminator, daemon=True)
    thread.start()
    thread.join(timeout=60)
    done.set()
    after_cuts = JobRun.objects.filter(label="pgkill").order_by("-id").values_list(
        "id", flat=True).first() or 0
    # Work for after the cuts, held at a gate until each worker has begun some: the 400 may
    # all have run meanwhile (a stalled test process), and one worker could take them all.
    gate = tmp_path / "gate"
    dispatch_many([jobs.Record("pgkill-after", key=str(i), gate=str(gate)) for i in range(10)])
    wait_for(lambda: set(JobRun.objects.filter(label="pgkill-after").values_list(
        "pid", flat=True)) == {p.pid for p in procs}, timeout=120,
        what="each worker running a job dispatched after the cuts")
    gate.touch()

    wait_for(lambda: not QueuedJob.objects.exists(), timeout=120)
    assert all(p.poll() is None for p in procs), workers.errors()  # no worker died
    # each worker reconnected and kept working after the last cut...
    later = set(JobRun.objects.filter(label__startswith="pgkill", id__gt=after_cuts,
                                      ended_at__isnull=False).values_list("pid", flat=True))
    assert later == {p.pid for p in procs}
    # ...and LISTENs again (re-opened a few seconds after losing it)
    with connection.cursor() as cursor:
        wait_for(lambda: len(_worker_backends(cursor, listening=True)) == len(procs),
                 timeout=30)
    assert all(code == 0 for code in workers.stop_all()), workers.errors()

    out = Outcome.read((h.id for h in handles), "pgkill")
    assert len(terminated) >= 4
    assert out.queued == 0
    assert out.completed == out.ids, (len(out.completed), out.failed)  # all ran to the end
    assert not out.failed
