"""Claims on a connection of their own (PostgreSQL, ``OPTIONS["prepare_threshold"]`` set).

There the claim is a prepared statement (parsed and planned once per connection, not per
claim) on a session that never sorts, so whatever plan PostgreSQL caches for it, custom or
generic, made on an empty queue or a full one, reads ``jobguard_claim_idx`` in order. On
Django's own connection it cannot be: the ``SET LOCAL enable_sort = off`` sent before it
needs the simple query protocol.
"""

from __future__ import annotations

import json
import re
import threading
import uuid

import pytest
from django.db import DatabaseError, InterfaceError, connection, connections, transaction

from django_jobguard import dispatch_many, queue
from django_jobguard.dialects import dialect_for, postgresql
from django_jobguard.models import QueuedJob
from django_jobguard.worker import Worker, WorkerOptions
from tests.support import jobs, requires_postgres

pytestmark = [requires_postgres]


@pytest.fixture
def prepared(monkeypatch):
    """The default alias with prepared statements allowed (what a deployment without a
    transaction pooler may set), read by each new connection and by the claim's check."""
    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    monkeypatch.setitem(options, "prepare_threshold", 5)
    yield
    postgresql.close_claim_connections()


def _claim_connection():
    """This thread's claim connection (psycopg's) of the default alias."""
    wrappers = vars(postgresql._claim_connections._local).get("wrappers", {})
    wrapper = wrappers.get("default")
    return wrapper.connection if wrapper is not None else None


def _pid(conn) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.django_db(transaction=True)
def test_a_claim_is_prepared_on_a_connection_of_its_own_that_never_sorts(prepared):
    handles = [jobs.Noop(n).dispatch() for n in range(3)]
    rows = queue.claim(["default"], worker_id="w", limit=2, start=1)
    assert [str(r.id) for r in rows] == [str(h.id) for h in handles[:2]]
    assert [r.attempt_counted for r in rows] == [True, False]
    assert QueuedJob.objects.get(id=rows[0].id).attempts == 1  # the start counted
    claims = _claim_connection()
    assert claims is not None and _pid(claims) != _pid(connection.connection)
    assert claims.execute("SHOW enable_sort").fetchone()[0] == "off"
    assert claims.execute("SHOW jit").fetchone()[0] == "off"
    prepared_sql = [sql for (sql,) in claims.execute(
        "SELECT statement FROM pg_prepared_statements").fetchall()]
    assert any("FOR UPDATE SKIP LOCKED" in sql for sql in prepared_sql), prepared_sql
    with connection.cursor() as cursor:  # Django's own connection is untouched
        cursor.execute("SHOW enable_sort")
        assert cursor.fetchone()[0] == "on"


@pytest.mark.django_db(transaction=True)
def test_a_generic_plan_cached_on_an_empty_queue_still_reads_the_claim_index_in_order(
        prepared):
    table = QueuedJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {table}")  # a drained queue, as autovacuum leaves it
    assert queue.claim(["default"], worker_id="w", limit=128, start=1) == []
    claims = _claim_connection()
    claims.execute("SET plan_cache_mode = force_generic_plan")
    assert queue.claim(["default"], worker_id="w", limit=128, start=1) == []  # cached: 0 rows
    # The burst (as tests/unit/dialects/test_claim_plan.py's): pages of 1.5 kB rows, the
    # planner's guess scaled by them, and five rows that go first.
    dispatch_many([jobs.Noop("".join(uuid.uuid4().hex for _ in range(48)))
                   for _ in range(6000)])
    dispatch_many([jobs.Noop(i) for i in range(5)], priority=10)
    ((name, types),) = claims.execute(
        "SELECT name, parameter_types::text[] FROM pg_prepared_statements "
        "WHERE statement LIKE %s", ["%FOR UPDATE SKIP LOCKED%"]).fetchall()
    # psycopg numbers the named parameters in the order they first appear
    values = {"queue": "'default'", "limit": "128", "worker": "'w'", "lease": "90", "count": "1"}
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", dialect_for("default").claim_sql)))
    assert len(types) == len(names) == 5, (types, names)
    (plan,) = claims.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}("
                             f"{', '.join(values[n] for n in names)})").fetchone()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = list(_nodes(plan[0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")], nodes
    assert [n.get("Index Name") for n in nodes if n["Node Type"] == "Index Scan"][0] == \
        "jobguard_claim_idx", nodes
    rows = queue.claim(["default"], worker_id="w", limit=128, start=1)
    assert len(rows) == 128 and [row.priority for row in rows[:6]] == [10] * 5 + [0]
    assert QueuedJob.objects.filter(reserved_by="w").count() == 128


@pytest.mark.django_db
def test_a_claim_inside_a_transaction_is_made_on_the_transaction_s_connection(prepared):
    # (a concurrency cap's gate, a test's transaction): only that connection sees its rows
    with transaction.atomic():
        handle = jobs.Noop(1).dispatch()
        rows = queue.claim(["default"], worker_id="w", limit=1)
    assert [str(r.id) for r in rows] == [str(handle.id)]
    assert _claim_connection() is None


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_connection_broke_fails_and_the_next_one_reconnects(prepared):
    first, second = jobs.Noop(1).dispatch(), jobs.Noop(2).dispatch()
    assert [str(r.id) for r in queue.claim(["default"], worker_id="w")] == [str(first.id)]
    claims = _claim_connection()
    old_pid = _pid(claims)
    with connection.cursor() as cursor:  # the server ends that session (a restart, a kill)
        cursor.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    with pytest.raises((DatabaseError, InterfaceError)):
        queue.claim(["default"], worker_id="w")
    assert _claim_connection() is None  # closed: nothing half-read is kept
    assert [str(r.id) for r in queue.claim(["default"], worker_id="w")] == [str(second.id)]
    assert _pid(_claim_connection()) != old_pid


@pytest.mark.django_db(transaction=True)
def test_a_worker_closes_its_claim_connections_as_it_ends(prepared, monkeypatch):
    from django_jobguard.worker import claiming

    for n in range(40):  # a backlog: claims of the loop's own and on the claim thread
        jobs.Noop(n).dispatch()
    monkeypatch.setattr(claiming, "AHEAD_SECONDS", 60.0)  # every batch counts as fast
    threads: list[str] = []
    real_claim = postgresql.ClaimConnections.claim

    def claim(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return real_claim(self, *args, **kwargs)

    monkeypatch.setattr(postgresql.ClaimConnections, "claim", claim)
    worker = Worker(WorkerOptions(stop_when_empty=True, sleep=0, memory=0, batch=4))
    assert worker.run() == 0
    assert not QueuedJob.objects.exists()
    # both the loop's thread and the claim thread claimed apart...
    assert threading.current_thread().name in threads, threads
    assert any(name.startswith("jobguard-claim") for name in threads), threads
    # ...and both closed their connections as the worker ended
    assert _claim_connection() is None
    assert postgresql._claim_connections._all == []
    # the thread claims apart again (the next worker a test or a script runs in it)
    jobs.Noop("again").dispatch()
    assert len(queue.claim(["default"], worker_id="w")) == 1
    assert _claim_connection() is not None


@pytest.mark.django_db(transaction=True)
def test_each_thread_claims_on_its_own_connection(prepared):
    for n in range(2):
        jobs.Noop(n).dispatch()
    pids: list[int] = []
    claimed, done = threading.Event(), threading.Event()

    def claim_in_a_thread() -> None:
        try:
            assert len(queue.claim(["default"], worker_id="t")) == 1
            pids.append(_pid(_claim_connection()))
            claimed.set()
            done.wait(30)  # its connection stays open while the main thread claims
        finally:
            queue.close_claim_connections()
            connections.close_all()

    thread = threading.Thread(target=claim_in_a_thread)
    thread.start()
    try:
        assert claimed.wait(30)
        assert len(queue.claim(["default"], worker_id="w")) == 1
        assert pids and pids[0] != _pid(_claim_connection())  # both open, two sessions
    finally:
        done.set()
        thread.join()


@pytest.mark.django_db(transaction=True)
def test_no_claim_connection_behind_a_declared_pgbouncer(prepared, settings):
    # A session setting there would reach the pool's other clients: the claim stays on
    # Django's connection with its SET LOCAL, as without prepared statements.
    settings.JOBGUARD = {**settings.JOBGUARD, "PGBOUNCER": ["default"]}
    handle = jobs.Noop(1).dispatch()
    assert [str(r.id) for r in queue.claim(["default"], worker_id="w")] == [str(handle.id)]
    assert _claim_connection() is None


def test_no_claim_connection_where_django_s_pool_hands_out_the_sessions(prepared, monkeypatch):
    # (Read from OPTIONS only: a connection made here with "pool" would open Django's pool,
    # whose sessions outlive the test.)
    wrapper = connections["default"]
    assert postgresql._claims_apart(wrapper)
    monkeypatch.setitem(wrapper.settings_dict["OPTIONS"], "pool", True)
    assert not postgresql._claims_apart(wrapper)
