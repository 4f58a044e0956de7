"""jobguard through PgBouncer in transaction pooling mode (tests/support/pgbouncer.py).

The test's own PgBouncer (two server connections shared by every client) sits in front of
the test database. In-process tests point the ``default`` alias at it (autocommit, so each
statement is its own transaction and may run on another server connection); worker processes
get it through their settings (tests/settings.py). What must hold: dispatch, claim, ack,
unique and overlap locks and rate-limit counters work through it; a worker with
``LISTEN_DATABASE`` (a direct connection) wakes on a NOTIFY sent through PgBouncer; a worker
without one polls, after one warning, and never hangs.
"""

from __future__ import annotations

import shutil
import threading
import uuid

import pytest
from demo.models import JobRun
from django.db import connection, connections

from django_jobguard import dispatch_many, queue
from django_jobguard.dialects import ListenUnavailable
from django_jobguard.models import Lock, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.stores import get_store
from django_jobguard.stores.base import RateWindow
from tests.support import jobs, requires_postgres, wait_for, work, worker_env
from tests.support.limit_jobs import RateRecord
from tests.support.lock_jobs import Overlap, UniqueRecord
from tests.support.pgbouncer import running
from tests.support.pgbouncer import version as pgbouncer_version

pytestmark = [
    requires_postgres,
    pytest.mark.skipif(shutil.which("pgbouncer") is None,
                       reason="needs the pgbouncer binary: apt-get install pgbouncer"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(scope="module")
def bouncer(django_db_setup, django_db_blocker):
    db = connection.settings_dict
    yield from running(host=db["HOST"] or "127.0.0.1", port=int(db["PORT"] or 5432),
                       user=db["USER"] or "postgres")


@pytest.fixture
def via_bouncer(transactional_db, bouncer):
    """The ``default`` alias, in every thread, goes through the PgBouncer during the test,
    configured for it (no ``prepare_threshold``, even where the suite runs with one)."""
    conn = connections["default"]
    saved = dict(conn.settings_dict)
    conn.close()
    options = {k: v for k, v in (saved.get("OPTIONS") or {}).items() if k != "prepare_threshold"}
    conn.settings_dict.update(PORT=str(bouncer.port), DISABLE_SERVER_SIDE_CURSORS=True,
                              OPTIONS=options)
    try:
        yield bouncer
    finally:
        conn.close()
        conn.settings_dict.clear()
        conn.settings_dict.update(saved)


@pytest.fixture
def listen_alias(settings, bouncer):
    """A ``listen`` alias with a direct connection to the test database (PostgreSQL's port,
    not PgBouncer's), named in ``LISTEN_DATABASE``."""
    direct = {**connections["default"].settings_dict, "PORT": str(bouncer.server[1]),
              "DISABLE_SERVER_SIDE_CURSORS": False}
    connections.settings["listen"] = direct  # the dict Django builds connections from
    settings.JOBGUARD = {**settings.JOBGUARD, "LISTEN_DATABASE": "listen"}
    yield "listen"
    if hasattr(connections._connections, "listen"):
        connections["listen"].close()
        del connections["listen"]
    connections.settings.pop("listen", None)


def _in_threads(n: int, target) -> list:
    """Run ``target(i)`` in ``n`` threads, each with its own client connection to PgBouncer."""
    results: list = [None] * n
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def test_dispatch_claim_and_ack_through_pgbouncer(via_bouncer):
    name = connection.settings_dict["NAME"]
    before = via_bouncer.transactions(name)
    dispatch_many([jobs.Record("pgb", key=str(i)) for i in range(30)])
    jobs.Record("single").dispatch()

    def claim_and_ack(i: int) -> list[str]:
        done = []
        while rows := queue.claim(["default"], worker_id=f"t{i}", limit=4):
            for row in rows:
                assert queue.start(row) and queue.ack(row)
                done.append(str(row.id))
        return done

    claimed = [job_id for done in _in_threads(3, claim_and_ack) for job_id in done]
    assert len(claimed) == len(set(claimed)) == 31  # each once, none lost
    assert not QueuedJob.objects.exists()
    assert via_bouncer.transactions(name) - before >= 31  # they did go through PgBouncer


def test_locks_and_counters_through_pgbouncer(via_bouncer):
    store = get_store("database")
    key = f"jobguard:overlap:pgb:{uuid.uuid4().hex}"

    tokens = _in_threads(4, lambda i: store.acquire(key, f"owner-{i}", ttl=30))
    holders = [i for i, token in enumerate(tokens) if token is not None]
    assert len(holders) == 1  # exactly one of four clients got it
    assert not store.release(key, "someone-else")
    assert store.release(key, f"owner-{holders[0]}")
    assert store.acquire(key, "next", ttl=30) > tokens[holders[0]]  # fencing token grows

    window = RateWindow(key=f"jobguard:rate:pgb:{uuid.uuid4().hex}", limit=5, decay=60)
    admitted = _in_threads(4, lambda i: sum(store.hit_rate_limits([window]).allowed
                                           for _ in range(4)))
    assert sum(admitted) == 5  # 16 hits from four clients, five admitted


def test_unique_overlap_and_rate_limited_jobs_run_through_pgbouncer(via_bouncer):
    assert UniqueRecord("u1", label="unique").dispatch()
    assert not UniqueRecord("u1", label="unique").dispatch()  # the unique lock holds
    Overlap("o1", label="overlap").dispatch()
    for i in range(3):
        RateRecord("rate", key=f"r{i}").dispatch()
    states = work()
    assert states.count("DONE") == 5
    assert sorted(JobRun.objects.values_list("label", flat=True)) == [
        "overlap", "rate", "rate", "rate", "unique"]
    assert not Lock.objects.exclude(owner="").exists()  # unique and overlap locks released
    assert UniqueRecord("u1", label="unique").dispatch()  # free again after the success


def test_a_listen_database_hears_a_notify_sent_through_pgbouncer(via_bouncer, listen_alias):
    listener = queue.listen()
    assert listener is not None
    try:
        jobs.Record("wake").dispatch()  # its NOTIFY goes through PgBouncer
        assert listener.wait(10) is True
    finally:
        listener.close()


def test_listen_through_pgbouncer_is_found_out_by_the_probe(via_bouncer):
    with pytest.raises(ListenUnavailable, match=r"did not reach a LISTEN.*LISTEN_DATABASE"):
        queue.listen()


def test_a_declared_pgbouncer_without_listen_database_does_not_listen(via_bouncer, settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "PGBOUNCER": ["default"]}
    with pytest.raises(ListenUnavailable, match=r"behind PgBouncer.*LISTEN_DATABASE"):
        queue.listen()


def _bouncer_env(bouncer, **extra: str) -> dict[str, str]:
    return worker_env(JOBGUARD_TEST_PGBOUNCER_PORT=str(bouncer.port), **extra)


@pytest.mark.slow
def test_a_worker_with_listen_database_wakes_on_notify_through_pgbouncer(via_bouncer,
                                                                        workers):
    env = _bouncer_env(via_bouncer, JOBGUARD_TEST_PGBOUNCER_DECLARED="1",
                       JOBGUARD_TEST_LISTEN_DIRECT="1")
    # An earlier test's probe LISTENed through this bouncer (its UNLISTEN may reach another
    # server connection): the bouncer may log a NOTIFY for it any time; this test's lines only.
    mark = via_bouncer.log_size()
    pool = workers(1, "--sleep", "120", "--max-jobs", "5", env=env)
    # LISTEN starts right after the worker registers and before its first claim, so a job
    # dispatched from here on is either claimed at once or wakes the idle wait.
    wait_for(lambda: WorkerRow.objects.exists(), timeout=60)
    assert UniqueRecord("u1", label="unique").dispatch()
    Overlap("o1", label="overlap").dispatch()
    RateRecord("rate", key="r1").dispatch()
    jobs.Record("first").dispatch()
    wait_for(lambda: JobRun.objects.count() == 4, timeout=60)
    jobs.Record("woken").dispatch()  # the worker idles (or is about to) for 120 s
    out = pool.wait(60)[0]  # polling alone would take 120 s
    assert sorted(JobRun.objects.values_list("label", flat=True)) == [
        "first", "overlap", "rate", "unique", "woken"]
    assert not Lock.objects.exclude(owner="").exists()  # the worker released its locks
    assert "polls every" not in out and "LISTEN" not in out, out
    assert "got packet 'A'" not in via_bouncer.log_text(mark)  # nothing LISTENed through it


@pytest.mark.slow
def test_a_worker_without_listen_database_warns_once_and_polls(via_bouncer, workers):
    # Not declared in JOBGUARD['PGBOUNCER']: the start-up probe finds out.
    pool = workers(1, "--sleep", "0.5", "--max-jobs", "3", env=_bouncer_env(via_bouncer))
    wait_for(lambda: WorkerRow.objects.exists(), timeout=60)
    for i in range(3):
        jobs.Record("polled", key=str(i)).dispatch()
    out = pool.wait(90)[0]
    assert JobRun.objects.filter(label="polled").count() == 3
    assert out.count("did not reach a LISTEN") == 1, out
    assert "polls every 0.5 s (--sleep) instead" in out


@pytest.mark.parametrize("prepare_threshold", [None, 0])
def test_prepared_statements_break_on_another_server_connection(via_bouncer, prepare_threshold):
    """Why jobguard.W111 warns: with ``prepare_threshold`` psycopg prepares jobguard's ack on
    one server connection, and PgBouncer < 1.21 runs a later execution on another one. Without
    it (Django's default) the same sequence works."""
    import psycopg
    from django.db import DatabaseError

    from django_jobguard.dialects import dialect_for

    if prepare_threshold is not None and pgbouncer_version() >= (1, 21):
        pytest.skip("PgBouncer >= 1.21 may track prepared statements (max_prepared_statements)")

    conn = connections["default"]
    conn.close()
    conn.settings_dict["OPTIONS"] = {**conn.settings_dict.get("OPTIONS", {}),
                                     "prepare_threshold": prepare_threshold}
    dialect = dialect_for("default")
    assert dialect.ack(uuid.uuid4(), "w", 0) is False  # runs (and, at 0, prepares) on server 1
    # Another client takes server 1 (PgBouncer hands out the last used server first) and keeps
    # it in a transaction, so the next ack gets server 2.
    with psycopg.connect(**via_bouncer.params(dbname=connection.settings_dict["NAME"])) as other:
        other.execute("BEGIN")
        other.execute("SELECT 1")
        if prepare_threshold is None:
            assert dialect.ack(uuid.uuid4(), "w", 0) is False
        else:
            with pytest.raises(DatabaseError, match=r"prepared statement .* does not exist"):
                dialect.ack(uuid.uuid4(), "w", 0)
        other.execute("ROLLBACK")


def test_a_worker_behind_a_declared_pgbouncer_polls_after_one_warning(settings, caplog):
    from django_jobguard.worker import Worker, WorkerOptions

    settings.JOBGUARD = {**settings.JOBGUARD, "PGBOUNCER": ["default"]}
    worker = Worker(WorkerOptions(sleep=7))
    with caplog.at_level("WARNING", logger="django_jobguard.worker"):
        worker._open_listener()
        worker._reopen_listener(retry_every=0)  # nothing to retry: the setup will not change
    assert worker._listener is None
    assert [r.getMessage() for r in caplog.records] == [
        f"Database 'default' is behind PgBouncer (JOBGUARD['PGBOUNCER']) and "
        f"JOBGUARD['LISTEN_DATABASE'] is not set: LISTEN needs a session connection "
        f"(docs/databases.md#pgbouncer). Worker {worker.id} polls every 7 s (--sleep) instead."]


def test_an_unreachable_listen_database_is_retried_while_the_worker_polls(listen_alias, caplog):
    from django_jobguard.worker import Worker, WorkerOptions

    connections.settings[listen_alias]["PORT"] = str(_closed_port())
    worker = Worker(WorkerOptions(sleep=1))
    with caplog.at_level("WARNING", logger="django_jobguard.worker"):
        worker._open_listener()
        assert worker._listener is None and worker._listener_lost_at is not None
        worker._reopen_listener(retry_every=0)  # an outage: asked again
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("LISTEN unavailable (")
    assert messages[1].startswith("LISTEN still unavailable (")


def _closed_port() -> int:
    from tests.support.pgbouncer import free_port

    return free_port()  # bound a moment ago and released: nothing listens there
