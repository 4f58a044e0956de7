"""Each primitive of the database dialect, through its interface, on the database under test:
the clock, push, claim, ack, NOTIFY/LISTEN, the lock upsert and release, the throttle rows.

Every test runs on the database's own dialect and on the generic ORM one (what MySQL/MariaDB
and other backends use), so that path is exercised on whatever database CI has.
"""

from __future__ import annotations

import datetime
import json
import threading
import uuid

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobguard import clock
from django_jobguard.dialects import Dialect, ThrottleRow, dialect_for
from django_jobguard.dialects.mysql import GenericDialect
from django_jobguard.models import FailedJob, Lock, QueuedJob, Throttle
from django_jobguard.queue import NewJob
from tests.support import POSTGRES, work

pytestmark = pytest.mark.django_db

MS = datetime.timedelta(milliseconds=1)


@pytest.fixture(params=["native", "generic"])
def dialect(request) -> Dialect:
    return dialect_for("default") if request.param == "native" else GenericDialect("default")


def _job(payload: str = '{"args":[],"kwargs":{}}', **fields) -> NewJob:
    return NewJob(**{"name": "tests.support.jobs.Noop", "queue": "default", "payload": payload,
                     **fields})


def _push_with_stored_text(dialect, payload: str) -> NewJob:
    """Push a job, then store ``payload`` as its row's text with a raw UPDATE: what a row
    written by other code looks like. (Pushing the text itself goes through the ORM on the
    generic dialect, and Django 6 decodes the inserted row's JSON back from RETURNING.)"""
    job = _job()
    dialect.push([job], batch_size=500)
    qn = connection.ops.quote_name
    column = QueuedJob._meta.get_field("payload").column
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {qn(QueuedJob._meta.db_table)} SET {qn(column)} = %s{cast} "
                       f"WHERE {qn('id')} = %s", [payload, job.id])
    return job


# -- lookup and clock ----------------------------------------------------------------------


def test_one_dialect_per_alias_holding_no_connection(dialect):
    assert dialect_for("default") is dialect_for("default") and dialect.using == "default"
    held = [value for value in vars(dialect).values()
            if isinstance(value, BaseDatabaseWrapper) or hasattr(value, "fetchone")]
    assert held == []


@pytest.mark.django_db(transaction=True)
def test_a_dialect_serves_every_thread_on_the_threads_own_connection(dialect):
    seen = {}

    def in_thread() -> None:
        try:
            seen["now"] = dialect.now()
            dialect.push([_job()], batch_size=500)
            seen["connection"] = connections["default"]
        finally:
            connections.close_all()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen["connection"] is not connections["default"]
    assert seen["now"].tzinfo is not None and QueuedJob.objects.count() == 1


def test_now_is_the_database_clock_in_utc(dialect):
    first, second = dialect.now(), dialect.now()
    assert first.utcoffset() == datetime.timedelta(0)
    assert first <= second
    # Same machine in the tests: the database clock and this process's agree closely.
    assert abs(first - timezone.now()) < datetime.timedelta(seconds=5)


# -- push ----------------------------------------------------------------------------------


def test_push_stores_the_payload_text_and_the_time_to_run(dialect):
    at = datetime.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    payload = '{"args":[1,"\\u00e9",{"deep":[null,true]}],"kwargs":{"n":1.5}}'
    dated = _job(payload, at=at, priority=7)
    before = dialect.now()
    dialect.push([dated], batch_size=500)
    later = _job(delay=30.5)
    dialect.push([later], batch_size=500)
    now = _job(priority=-3)
    dialect.push([now], batch_size=500)
    after = dialect.now()

    row = QueuedJob.objects.get(id=dated.id)
    assert row.payload == json.loads(payload)
    assert (row.available_at, row.priority, row.attempts, row.reserved_by) == (at, 7, 0, "")
    assert row.reserved_at is None
    delayed = QueuedJob.objects.get(id=later.id).available_at
    assert before + datetime.timedelta(seconds=30.5) - MS <= delayed
    assert delayed <= after + datetime.timedelta(seconds=30.5) + MS
    due = QueuedJob.objects.get(id=now.id)
    assert before - MS <= due.available_at <= after + MS and due.priority == -3


def test_push_in_batches_keeps_each_rows_time(dialect):
    at = timezone.now() + datetime.timedelta(days=1)
    times = [(at, None), (None, 60.0), (None, -5.0), (None, 0.00001), (None, None)]
    batch = [_job(f'{{"args":[{i}],"kwargs":{{}}}}', at=row_at, delay=delay)
             for i, (row_at, delay) in enumerate(times)]
    before = dialect.now()
    with CaptureQueriesContext(connection) as ctx:
        dialect.push(batch, batch_size=2)
    after = dialect.now()
    assert sum("INSERT" in q["sql"].upper() for q in ctx.captured_queries) == 3
    rows = {row.id: row for row in QueuedJob.objects.all()}
    assert [rows[job.id].payload["args"] for job in batch] == [[i] for i in range(5)]
    assert rows[batch[0].id].available_at == at
    for job, (_, delay) in zip(batch[1:], times[1:], strict=True):
        shift = datetime.timedelta(seconds=delay or 0)
        assert before + shift - MS <= rows[job.id].available_at <= after + shift + MS, delay


def test_push_stores_every_column_of_batches_that_share_them_or_not(dialect):
    """A batch whose rows share all but their id and payload (PostgreSQL sends the shared
    values once) and batches that differ in one column each store every row's own."""
    at = datetime.datetime(2031, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    shared = {"queue": "q1", "name": "tests.support.jobs.Record", "priority": 7, "at": at,
              "fair_key": "tenant-1"}
    differing = [("queue", "q2"), ("name", "tests.support.jobs.Noop"), ("priority", -2),
                 ("at", at + datetime.timedelta(hours=1)), ("fair_key", "tenant-2")]
    batches = [[_job(f'{{"args":[{i}],"kwargs":{{}}}}', **shared) for i in range(3)]]
    for field, value in differing:
        batches.append([_job(**shared), _job(**{**shared, field: value})])
    delays = [_job(delay=30.0), _job(delay=30.0)], [_job(delay=30.0), _job(delay=None)]
    before = dialect.now()
    for batch in [*batches, *delays]:
        dialect.push(batch, batch_size=len(batch))
    after = dialect.now()
    rows = {row.id: row for row in QueuedJob.objects.all()}
    assert [rows[job.id].payload["args"] for job in batches[0]] == [[0], [1], [2]]
    for job in [job for batch in batches for job in batch]:
        row = rows[job.id]
        assert (row.queue, row.name, row.priority, row.available_at, row.fair_key) == (
            job.queue, job.name, job.priority, job.at, job.fair_key)
    for job in [job for batch in delays for job in batch]:
        shift = datetime.timedelta(seconds=job.delay or 0)
        assert before + shift - MS <= rows[job.id].available_at <= after + shift + MS


def test_push_refuses_a_payload_that_is_not_json(dialect):
    with pytest.raises(DatabaseError), transaction.atomic():
        dialect.push([_job("{not json")], batch_size=500)
    assert not QueuedJob.objects.exists()


# -- claim and ack -------------------------------------------------------------------------


def test_claim_leases_due_rows_in_priority_then_age_order(dialect):
    jobs = [_job(priority=p) for p in (0, 5, 0, -5)]
    for job in jobs:  # one statement each, so that their ages differ
        dialect.push([job], batch_size=500)
    later = _job(delay=3600.0, priority=100)
    other = _job(priority=100, queue="other")
    dialect.push([later, other], batch_size=500)
    before = dialect.now()
    claimed = dialect.claim("default", worker_id="w1", limit=3, lease=90.0)
    after = dialect.now()

    assert {r.id for r in claimed} == {jobs[1].id, jobs[0].id, jobs[2].id}
    for row in claimed:
        assert (row.attempts, row.reserved_by) == (1, "w1")
        assert before - MS <= row.reserved_at <= after + MS
        lease_end = row.available_at - datetime.timedelta(seconds=90)
        assert before - MS <= lease_end <= after + MS
        assert row.payload == {"args": [], "kwargs": {}}
        assert isinstance(row.payload_text_length, int) and row.payload_text_length >= 22
    assert [r.id for r in dialect.claim("default", worker_id="w2", limit=5, lease=90.0)] == [
        jobs[3].id]  # leased rows and the delayed one are not due
    assert dialect.claim("default", worker_id="w2", limit=5, lease=90.0) == []
    assert QueuedJob.objects.get(id=later.id).reserved_by == ""
    assert QueuedJob.objects.get(id=other.id).reserved_by == ""


def test_a_claimed_rows_times_are_the_ones_the_orm_loads(dialect):
    """The PostgreSQL claim loads its rows' times with psycopg's own loader (not Django's,
    which parses them in Python): the same aware UTC values the ORM gives."""
    job = _job(delay=-5.0)
    dialect.push([job], batch_size=500)
    (claimed,) = dialect.claim("default", worker_id="w", limit=1, lease=90.0)
    stored = QueuedJob.objects.get(id=job.id)
    for name in ("created_at", "available_at", "reserved_at"):
        value = getattr(claimed, name)
        assert value == getattr(stored, name), name
        assert value.utcoffset() == datetime.timedelta(0), name
        assert timezone.is_aware(value), name


def test_a_claim_ahead_leases_rows_without_counting_their_attempt(dialect):
    first, second = _job(), _job()
    dialect.push([first, second], batch_size=500)
    (counted,) = dialect.claim("default", worker_id="w", limit=1, lease=90.0)
    (ahead,) = dialect.claim("default", worker_id="w", limit=1, lease=90.0,
                             count_attempts=False)
    assert (counted.attempts, ahead.attempts) == (1, 0)
    assert {counted.id, ahead.id} == {first.id, second.id}
    assert ahead.reserved_by == "w" and ahead.reserved_at is not None
    assert QueuedJob.objects.get(id=ahead.id).attempts == 0
    assert QueuedJob.objects.reserved().count() == 2


def test_claim_keeps_a_payload_nested_too_deep_to_decode_as_text(dialect):
    deep = "[" * 1999 + "]" * 1999
    try:
        json.loads(deep)
    except RecursionError:
        pass
    else:
        pytest.skip("this Python decodes 1999 levels; nothing to keep as text")
    try:
        with transaction.atomic():
            job = _push_with_stored_text(dialect, deep)
    except DatabaseError:
        pytest.skip(f"{connection.vendor} refuses JSON nested 1999 deep")
    (row,) = dialect.claim("default", worker_id="w", limit=1, lease=90.0)
    assert row.id == job.id and row.payload == deep  # the stored text itself


def test_the_worker_fails_a_payload_nested_too_deep_with_a_reason(dialect):
    deep = '{"args":' + "[" * 1998 + "]" * 1998 + ',"kwargs":{}}'
    try:
        json.loads(deep)
        pytest.skip("this Python decodes 1998 levels")
    except RecursionError:
        pass
    try:
        with transaction.atomic():
            _push_with_stored_text(dialect, deep)
    except DatabaseError:
        pytest.skip(f"{connection.vendor} refuses JSON nested 1998 deep")
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get()
    assert failed.message.endswith("Corrupt payload for tests.support.jobs.Noop: the stored "
                                   "payload is nested too deeply for Python's JSON decoder.")


def test_ack_deletes_only_a_row_the_worker_still_holds(dialect):
    kept, done = _job(), _job()
    dialect.push([kept, done], batch_size=500)
    dialect.claim("default", worker_id="w", limit=2, lease=90.0)
    QueuedJob.objects.filter(id=kept.id).update(reserved_by="other")
    assert dialect.ack(kept.id, "w", 1) is False
    assert dialect.ack(done.id, "w", 1) is True
    assert dialect.ack(done.id, "w", 1) is False
    assert list(QueuedJob.objects.values_list("id", flat=True)) == [kept.id]
    assert dialect.ack(uuid.uuid4(), "w", 1) is False


def test_ack_of_an_earlier_claim_by_the_same_worker_changes_nothing(dialect):
    """The owner check tells attempts apart, not only workers: a thread that was given up
    (stuck past its timeout) cannot ack the row its worker claimed again since."""
    job = _job()
    dialect.push([job], batch_size=500)
    (first,) = dialect.claim("default", worker_id="w", limit=1, lease=90.0)
    QueuedJob.objects.filter(id=job.id).update(reserved_by="", reserved_at=None,
                                               available_at=clock.db_now())
    (second,) = dialect.claim("default", worker_id="w", limit=1, lease=90.0)
    assert (first.claims, second.claims) == (1, 2)
    assert dialect.ack(job.id, "w", first.claims) is False
    assert QueuedJob.objects.filter(id=job.id).exists()
    assert dialect.ack(job.id, "w", second.claims) is True


def test_ack_and_start_acks_one_row_and_counts_the_next_ones_attempt(dialect):
    done, ahead, other = _job(), _job(), _job()
    dialect.push([done, ahead, other], batch_size=500)
    dialect.claim("default", worker_id="w", limit=3, lease=90.0, count_attempts=False)
    QueuedJob.objects.filter(id=other.id).update(reserved_by="someone-else")
    assert dialect.ack_and_start(done.id, "w", 1, ahead.id, 1) == (True, True)
    assert not QueuedJob.objects.filter(id=done.id).exists()
    assert QueuedJob.objects.get(id=ahead.id).attempts == 1
    # owner-checked, each on its own: a row gone or held by another is neither acked nor started
    assert dialect.ack_and_start(done.id, "w", 1, other.id, 1) == (False, False)
    assert QueuedJob.objects.get(id=other.id).attempts == 0
    assert dialect.ack_and_start(ahead.id, "w", 1, other.id, 1) == (True, False)


# -- NOTIFY and LISTEN ---------------------------------------------------------------------


@pytest.mark.skipif(not POSTGRES, reason="only PostgreSQL has LISTEN")
@pytest.mark.django_db(transaction=True)
def test_a_listener_wakes_when_a_push_commits():
    dialect = dialect_for("default")
    listener = dialect.listen()
    assert listener is not None
    try:
        with transaction.atomic():
            dialect.push([_job()], batch_size=500)
            assert listener.wait(0.05) is False  # delivered at commit, not before
        assert listener.wait(10) is True
        # Outside a transaction: sent at once. One queue: two would be two commits, whose
        # notifications may reach the listener one wait apart.
        dialect.notify(["default"])
        assert listener.wait(10) is True
        assert listener.wait(0.05) is False  # drained
        with override_settings(JOBGUARD={"USE_NOTIFY": False}):
            dialect.push([_job(), _job()], batch_size=500)
            dialect.notify(["default"])
        assert listener.wait(0.2) is False
    finally:
        listener.close()


def test_without_listen_notify_runs_nothing(dialect):
    if POSTGRES and dialect is dialect_for("default"):
        pytest.skip("PostgreSQL has LISTEN")
    assert dialect.listen() is None
    with CaptureQueriesContext(connection) as ctx:
        dialect.notify(["default"])
    assert ctx.captured_queries == []


# -- locks ---------------------------------------------------------------------------------


def _us(value: datetime.datetime) -> int:
    return (value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(
        microseconds=1)


def test_lock_acquire_and_release(dialect):
    before = dialect.now()
    token = dialect.acquire_lock("k", "a", ttl=None, job_id="j1")
    assert isinstance(token, int) and token >= _us(before) - 1000  # floored at the clock
    assert dialect.acquire_lock("k", "b", ttl=None, job_id="") is None
    assert dialect.release_lock("k", "b") is False
    assert dialect.release_lock("k", "a") is True
    assert dialect.release_lock("k", "a") is False
    again = dialect.acquire_lock("k", "b", ttl=30.0, job_id="j2")
    assert again is not None and again > token
    row = Lock.objects.get(key="k")
    assert (row.owner, row.job_id, row.token) == ("b", "j2", again)
    assert before + datetime.timedelta(seconds=30) - MS <= row.expires_at
    assert row.expires_at <= dialect.now() + datetime.timedelta(seconds=30) + MS


def test_an_expired_lock_can_be_taken_over(dialect):
    token = dialect.acquire_lock("k", "a", ttl=30.0, job_id="")
    assert dialect.acquire_lock("k", "b", ttl=30.0, job_id="") is None
    Lock.objects.filter(key="k").update(expires_at=timezone.now() - datetime.timedelta(seconds=1))
    taken = dialect.acquire_lock("k", "b", ttl=None, job_id="")
    assert taken is not None and taken > token
    assert Lock.objects.get(key="k").expires_at is None


# -- throttle rows -------------------------------------------------------------------------


def test_lock_throttles_creates_missing_rows_in_key_order(dialect):
    Throttle.objects.create(key="b", kind="rate", data="kept", value=2.5, state="")
    with transaction.atomic():
        rows = dialect.lock_throttles(["c", "a", "b"], "circuit")
    assert list(rows) == ["a", "b", "c"]
    assert rows["b"] == ThrottleRow(key="b", data="kept", value=2.5, state="")
    assert rows["a"] == ThrottleRow(key="a", data="", value=0.0, state="")
    assert dict(Throttle.objects.values_list("key", "kind")) == {
        "a": "circuit", "b": "rate", "c": "circuit"}
    with transaction.atomic():
        assert list(dialect.lock_throttles(["a"], "rate")) == ["a"]
    assert Throttle.objects.count() == 3


def test_peek_and_write_throttle(dialect):
    assert dialect.peek_throttle("k") is None
    with transaction.atomic():
        dialect.lock_throttles(["k"], "rate")
        resets = datetime.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
        expires = resets + datetime.timedelta(minutes=1)
        before = dialect.now()
        dialect.write_throttle("k", kind="rate", hits=3, limit=10, state="closed", value=60.0,
                               data="[[1,2,3]]", resets_at=resets, expires_at=expires)
        dialect.write_throttle("other", kind="rate", hits=1, limit=1, state="", value=1.0,
                               data="", resets_at=None, expires_at=expires)  # no row: no-op
    assert dialect.peek_throttle("k") == ThrottleRow(key="k", data="[[1,2,3]]", value=60.0,
                                                     state="closed")
    row = Throttle.objects.get(key="k")
    assert (row.kind, row.hits, row.limit, row.resets_at, row.expires_at) == (
        "rate", 3, 10, resets, expires)
    assert before - MS <= row.updated_at <= dialect.now() + MS
    assert not Throttle.objects.filter(key="other").exists()


# -- relaxed acks (SYNCHRONOUS_ACKS) ------------------------------------------------------


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


@pytest.mark.skipif(not POSTGRES, reason="synchronous_commit is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("relaxed", [True, False])
def test_a_relaxed_ack_turns_synchronous_commit_off_for_its_transaction_only(relaxed):
    dialect = dialect_for("default")
    jobs = [_job() for _ in range(4)]
    dialect.push(jobs, batch_size=500)
    dialect.claim("default", worker_id="w", limit=4, lease=90.0, count_attempts=False)
    expected = "off" if relaxed else "on"
    for ack in (lambda: dialect.ack(jobs[0].id, "w", 1, relaxed=relaxed),
                lambda: dialect.ack_and_start(jobs[1].id, "w", 1, jobs[2].id, 1,
                                              relaxed=relaxed),
                lambda: dialect.ack_counting(jobs[2].id, "w", 1, jobs[3].id, 1,
                                             uuid.uuid4(), relaxed=relaxed)):
        with transaction.atomic():  # SHOW inside the transaction the ack commits in
            done = ack()
            assert (done[0] if isinstance(done, tuple) else done) is True
            assert _synchronous_commit() == expected
        assert _synchronous_commit() == "on"  # set_config(..., true) ended with it
    assert not QueuedJob.objects.filter(id__in=[j.id for j in jobs[:3]]).exists()


def test_start_counts_the_attempt_of_a_row_still_held_by_the_same_claim(dialect):
    ahead, taken = _job(), _job()
    dialect.push([ahead, taken], batch_size=500)
    dialect.claim("default", worker_id="w", limit=2, lease=90.0, count_attempts=False)
    QueuedJob.objects.filter(id=taken.id).update(reserved_by="someone-else")
    assert dialect.start(ahead.id, "w", 1, relaxed=True) is True
    assert QueuedJob.objects.get(id=ahead.id).attempts == 1
    assert dialect.start(ahead.id, "w", 2) is False  # another claim's count
    assert dialect.start(taken.id, "w", 1) is False  # another worker's row
    assert QueuedJob.objects.get(id=taken.id).attempts == 0


def test_a_payload_that_does_not_decode_is_failed_with_why():
    from django_jobguard.dialects.base import load_payload
    from django_jobguard.envelope import Envelope
    from django_jobguard.exceptions import PayloadError

    broken = load_payload('{"args": [1')
    assert broken == '{"args": [1'  # the stored text itself
    with pytest.raises(PayloadError, match=r"^the stored payload is not valid JSON \(Expecting"):
        Envelope.decode(broken)
    with pytest.raises(PayloadError, match="^expected a JSON object, got str"):
        Envelope.decode(load_payload('"a JSON string"'))
