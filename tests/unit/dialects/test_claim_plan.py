"""The PostgreSQL claim picks and locks its rows once, whatever plan the planner chooses.

With ``WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` a plan made on stale
statistics re-ran the pick for every row of the table, each run locking another row (found by
bench/throughput.py: 4 claimers stalled for minutes on a 20k burst). The claim now picks in a
MATERIALIZED CTE; here the planner is pushed towards that bad plan shape and the pick must
still run exactly once and lease exactly ``limit`` rows.

A batch claim on a table analyzed while empty, a burst behind it, once took a bitmap scan of
every due row and a sort (85-110 ms a claim of 128 with 200,000 jobs waiting, found by
bench/peers.py); it now takes its rows in order from the claim index whatever the statistics.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard import dispatch_many
from django_jobguard.dialects import dialect_for
from django_jobguard.models import QueuedJob
from tests.support import jobs, requires_postgres

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _generic_plan_made_on_an_empty_queue(cursor, sql: str) -> None:
    """Prepare ``sql`` and cache its generic plan while the table is empty and analyzed (what
    a worker with ``prepare_threshold`` gets after idling, or autovacuum on a drained queue)."""
    table = QueuedJob._meta.db_table
    cursor.execute(f"VACUUM ANALYZE {table}")
    positional = (sql.replace("%(queue)s", "$1").replace("%(limit)s", "$2")
                  .replace("%(worker)s", "$3").replace("%(lease)s", "$4")
                  .replace("%(count)s", "$5"))
    cursor.execute(f"PREPARE jg_claim (text, int, text, float8, int) AS {positional}")
    cursor.execute("SET plan_cache_mode = force_generic_plan")
    cursor.execute("EXECUTE jg_claim ('default', 1, 'w', 90, 1)")  # plans now, on 0 rows


@pytest.mark.parametrize("limit", [1, 5])
def test_claim_locks_in_one_pass_even_with_a_plan_from_an_empty_queue(limit):
    sql = dialect_for("default").claim_sql
    with connection.cursor() as cursor:
        _generic_plan_made_on_an_empty_queue(cursor, sql)
        try:
            dispatch_many([jobs.Noop(i) for i in range(300)])  # the burst
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE jg_claim "
                           f"('default', {limit}, 'w', 90, 1)")
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE jg_claim")
            cursor.execute("RESET plan_cache_mode")
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = list(_nodes(plan[0]["Plan"]))
    lock_rows = [n for n in nodes if n["Node Type"] == "LockRows"]
    assert lock_rows and all(n["Actual Loops"] == 1 for n in lock_rows), nodes
    assert QueuedJob.objects.filter(reserved_by="w").count() == limit


def test_a_fair_claim_walks_the_keys_it_needs_and_locks_only_its_share():
    """The fair claim (fair_share.py) reads the index, not the queue: it descends a few times
    per key it visits and locks ``weight * ceil(limit / keys)`` rows of each (the first of
    them twice: found by the walk, taken by the pick), never the backlog."""
    from django_jobguard.fair_share import Cursor, FairClaim

    for key in range(40):
        dispatch_many([jobs.Noop(i) for i in range(50)], queue="fair", fair_key=f"t{key:02}")
    dialect = dialect_for("default")
    fair = FairClaim(Cursor("t10", 0))
    params = {"queue": "fair", "limit": 5, "worker": "w", "lease": 90, "count": 1,
              "ckey": fair.cursor.key, "cused": 0, "keys": 5, "per_key": None,
              "wkeys": [], "wvals": []}
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {QueuedJob._meta.db_table}")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + dialect.fair_claim_sql[False],
                       params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = list(_nodes(plan[0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes
    locked = sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes
                 if n["Node Type"] == "LockRows")
    assert locked == 2 * 5, nodes
    assert sorted(QueuedJob.objects.filter(reserved_by="w").values_list(
        "fair_key", flat=True)) == ["t11", "t12", "t13", "t14", "t15"]


def test_a_batch_claim_reads_the_claim_index_in_order_after_a_burst_into_an_empty_analyzed_queue():
    table = QueuedJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {table}")  # a drained queue, as autovacuum leaves it
    # The burst: 6,000 rows of 1.5 kB (random, so not compressed) fill the pages of a burst
    # of 40,000 no-op jobs; the planner, with no statistics, scales its guess by the pages.
    dispatch_many([jobs.Noop("".join(uuid.uuid4().hex for _ in range(48)))
                   for _ in range(6000)])
    dispatch_many([jobs.Noop(i) for i in range(5)], priority=10)  # these go first
    dialect = dialect_for("default")
    params = {"queue": "default", "limit": 128, "worker": "w", "lease": 90, "count": 1}
    # The plan of the claim as the dialect sends it: its SET, then the statement.
    explained = dialect.claim_statements.replace(
        dialect.claim_sql, "EXPLAIN (FORMAT JSON) " + dialect.claim_sql)
    with connection.cursor() as cursor:
        cursor.execute(explained, params)
        while cursor.description is None and cursor.nextset():
            pass
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = list(_nodes(plan[0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")], nodes
    assert [n.get("Index Name") for n in nodes if n["Node Type"] == "Index Scan"][0] == \
        "jobguard_claim_idx", nodes
    with CaptureQueriesContext(connection) as queries:
        rows = dialect.claim("default", worker_id="w", limit=128, lease=90)
    assert len(queries) == 1  # one query string, one round trip
    assert len(rows) == 128 and [row.priority for row in rows[:6]] == [10] * 5 + [0]
    assert QueuedJob.objects.filter(reserved_by="w").count() == 128
    with connection.cursor() as cursor:  # the SET ended with the claim's transaction
        cursor.execute("SHOW enable_sort")
        assert cursor.fetchone()[0] == "on"
