"""The database store when its database cannot be reached, in-process.

As the Redis store (tests/unit/stores/test_outage.py), every primitive raises
``StoreUnavailableError`` naming the store, chained to the database's error (before, the raw
``OperationalError`` / ``InterfaceError``, which the worker and ``ThrottlesExceptions`` took
for the job's own failure), and works again once the database is back. Errors the database
answered with (integrity, SQL, a deadlock inside the caller's transaction) stay what they are.

On any database the statements fail by :func:`tests.support.store_faults.statements_fail`; on
PostgreSQL the server also cuts the store's connection for real (``pg_terminate_backend``):
the store closes the broken connection, so the call after it connects again.
"""

from __future__ import annotations

import datetime

import pytest
from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    connection,
    transaction,
)
from django.utils import timezone

from django_jobguard import (
    Job,
    Limit,
    RateLimited,
    ThrottlesExceptions,
    WithoutOverlapping,
    rate_limiter,
)
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from django_jobguard.stores.base import RateWindow
from django_jobguard.worker import pipeline as pipeline_module
from tests.support import make_due, requires_postgres, store_faults, work
from tests.support.store_faults import CUT, statements_fail, terminate_backend

PRIMITIVES = {
    **store_faults.PRIMITIVES,
    "lock_page": lambda s: s.lock_page(),
    "count_locks": lambda s: s.count_locks(),
    "clean_expired": lambda s: s.clean_expired(),
    "clean_expired_throttles": lambda s: s.clean_expired_throttles(),
}


@pytest.mark.django_db
@pytest.mark.parametrize("make_error", [lambda: OperationalError(CUT),
                                        lambda: InterfaceError("connection already closed")],
                         ids=["operational", "interface"])
@pytest.mark.parametrize("primitive", sorted(PRIMITIVES))
def test_every_primitive_raises_store_unavailable_then_works_once_the_database_is_back(
        primitive, make_error):
    store, error = get_store("database"), make_error()
    # (in a savepoint of its own: a failed ORM write marks the test's transaction for rollback)
    with pytest.raises(StoreUnavailableError, match="store 'database' is unavailable") as caught, \
            transaction.atomic(), statements_fail(store_only=False, error=error) as switch:
        PRIMITIVES[primitive](store)
    assert switch.failed  # it did reach the database
    assert caught.value.store == "database"
    assert caught.value.__cause__ is error and caught.value.error is error

    PRIMITIVES[primitive](store)  # back: the same call goes through


@pytest.mark.django_db
@pytest.mark.parametrize("make_error", [
    lambda: IntegrityError("duplicate key"),
    lambda: ProgrammingError("syntax error at or near"),
    # SQLite's and MySQL's way to say it (a store database never migrated): the connection
    # still works, so it is the statement's error, not an outage (a review's finding)
    lambda: OperationalError("no such table: django_jobguard_lock")],
    ids=["integrity", "programming", "missing-table"])
def test_errors_the_database_answered_with_stay_what_they_are(make_error):
    error = make_error()
    with statements_fail(error=error), pytest.raises(type(error)) as caught:
        get_store("database").acquire("jobguard:k", "me", ttl=5)
    assert caught.value is error


def _serialization_failure() -> OperationalError:
    """Django's error for psycopg's SerializationFailure: told by its SQLSTATE (40001)."""
    errors = pytest.importorskip("psycopg.errors")
    error = OperationalError("could not serialize access due to concurrent update")
    error.__cause__ = errors.SerializationFailure("could not serialize access")
    return error


@pytest.mark.django_db
@pytest.mark.parametrize("conflict", [
    lambda: OperationalError("deadlock detected"),
    lambda: OperationalError("database is locked"),
    _serialization_failure], ids=["deadlock", "locked", "sqlstate-40001"])
def test_a_conflict_inside_the_callers_transaction_is_the_callers_to_retry(conflict):
    """A deadlock, a serialization failure or SQLite's locked database in the caller's own
    transaction (a unique dispatch's): the database answered, and the caller's ``except
    OperationalError`` that retries the transaction must still see it. A cut connection
    there is an outage."""
    store = get_store("database")
    error = conflict()
    with transaction.atomic(), statements_fail(error=error), \
            pytest.raises(OperationalError) as caught:
        store.acquire("jobguard:k", "me", ttl=5)
    assert caught.value is error
    with transaction.atomic(), statements_fail(), pytest.raises(StoreUnavailableError):
        store.acquire("jobguard:k", "me", ttl=5)


@pytest.mark.django_db(transaction=True)
def test_a_conflict_the_store_kept_meeting_outside_a_transaction_is_an_outage():
    """Out of a caller's transaction, the store retried its transaction itself (4 tries):
    what still fails is the store being unavailable to the worker (a job goes back without
    using an attempt)."""
    with statements_fail(error=OperationalError("database is locked")) as switch, \
            pytest.raises(StoreUnavailableError, match="database is locked"):
        get_store("database").circuit_leave("jobguard:c", owner="me", outcome="failure",
                                            max_attempts=3, decay=60)
    assert len(switch.failed) == 4


@pytest.mark.django_db(transaction=True)
def test_a_conflict_with_autocommit_off_is_the_callers_to_retry():
    """``set_autocommit(False)`` is the caller's transaction too: a conflict is not an
    outage, and the store does not close the connection under it (a review's finding)."""
    error = OperationalError("deadlock detected")
    transaction.set_autocommit(False)
    try:
        with statements_fail(error=error), pytest.raises(OperationalError) as caught:
            get_store("database").acquire("jobguard:k", "me", ttl=5)
        assert caught.value is error and connection.connection is not None
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)


# -- a connection the server cut (PostgreSQL) ---------------------------------------------------


@pytest.fixture
def cut():
    """``cut()`` terminates the backend of this thread's connection (as a restart of the
    server does), from a second connection. After the test a connection left broken is
    closed, so the test's flush connects again."""

    yield lambda: terminate_backend(connection)
    if connection.connection is not None and not connection.is_usable():
        connection.close()


#: Primitives that run in autocommit, one statement each: the cut is theirs to report.
AUTOCOMMIT = ["acquire", "release", "get_lock", "now", "circuit_enter", "throttles"]


@requires_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("primitive", AUTOCOMMIT)
def test_a_connection_the_server_cut_is_an_outage_and_the_next_call_reconnects(cut, primitive):
    """Before, the raw OperationalError; and every later call on the broken connection
    failed too, until something outside the store closed it."""
    store = get_store("database")
    assert store.acquire("jobguard:k", "me", ttl=60) is not None  # connected
    cut()
    with pytest.raises(StoreUnavailableError, match="store 'database' is unavailable") as caught:
        PRIMITIVES[primitive](store)
    assert isinstance(caught.value.__cause__, (OperationalError, InterfaceError))
    assert connection.connection is None  # the store closed the broken connection

    assert store.get_lock("jobguard:k").owner == "me"  # a new connection, the same lock
    assert store.circuit_leave("jobguard:c", owner="me", outcome="failure", max_attempts=3,
                               decay=60).failures == 1


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_transaction_of_the_store_is_tried_again_on_a_new_connection(cut):
    """A counter's write is one transaction, retried: a cut connection is replaced on its
    next try, unseen by the caller."""
    store = get_store("database")
    store.now()
    cut()
    assert store.circuit_leave("jobguard:c", owner="me", outcome="failure", max_attempts=3,
                               decay=60).failures == 1
    assert store.hit_rate_limits([RateWindow("jobguard:r", 5, 60)]).allowed


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_connection_someone_else_found_cut_does_not_fail_the_store(cut):
    """The job's own query met the cut (its OperationalError is the job's): the circuit
    still records the failure, on a new connection. Before, the store tried its transaction
    four times on the broken connection and raised the error of the last try."""
    store = get_store("database")
    store.now()
    cut()
    with pytest.raises(OperationalError), connection.cursor() as cursor:  # the job's query
        cursor.execute("SELECT 1")
    assert store.circuit_leave("jobguard:c", owner="me", outcome="failure", max_attempts=3,
                               decay=60).failures == 1


# -- a job whose middleware meets the outage before handle() -----------------------------------

ran: list[str] = []

rate_limiter.define("db-outage-test", lambda job: Limit.per_minute(100))


class GuardedByDatabase(Job):
    """One try; ``guard`` says which middleware asks the database store before handle()."""

    name = "tests.db_outage.GuardedByDatabase"
    tries = 1

    def __init__(self, guard: str):
        self.guard = guard

    def middleware(self):
        return {
            "overlap": [WithoutOverlapping("k", expire_after=10, store="database")],
            "rate": [RateLimited("db-outage-test", store="database")],
            "circuit": [ThrottlesExceptions(3, 60, store="database")],
        }[self.guard]

    def handle(self):
        ran.append(self.guard)


@pytest.mark.django_db
@pytest.mark.parametrize("guard", ["overlap", "rate", "circuit"])
def test_an_outage_before_handle_puts_the_job_back_without_using_its_only_try(
        guard, monkeypatch, released):
    """As with the Redis store (test_outage.py). Before, the OperationalError was the job's
    exception: with one try, the job FAILED without ever running."""
    monkeypatch.setattr(pipeline_module, "STORE_OUTAGE_PAUSE", 0.0)
    ran.clear()
    GuardedByDatabase(guard).dispatch()
    with statements_fail() as switch:
        assert work() == ["RELEASED"]
    assert switch.failed and ran == []  # the store was asked, and the job never ran ...
    row = QueuedJob.objects.get()  # ... so it is still queued, with its one try intact
    assert (row.attempts, row.exceptions, row.last_error) == (0, 0, "")
    assert row.available_at > timezone.now() + datetime.timedelta(
        seconds=pipeline_module.STORE_OUTAGE_DELAY - 1)
    assert [r["reason"] for r in released] == ["store_unavailable"]
    assert not FailedJob.objects.exists()

    make_due()  # the database is back: the job runs once
    assert work() == ["DONE"]
    assert ran == [guard]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
