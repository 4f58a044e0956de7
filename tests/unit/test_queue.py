"""django_jobguard.queue, through its functions, on the database under test: push, claim,
start, ack, release, fail, the lease, the cancel flag, paused queues and when rows are due
(the text kept of a job's exception: tests/unit/test_exceptions.py).

Each write of a claimed row is owner-checked; here that is asserted for a row whose lease ran
out and another worker claimed. Covered elsewhere, not repeated here: each dialect's
statements (tests/unit/dialects/test_dialects.py); the writes of an older claim by the same
worker (tests/unit/test_executor.py ``test_writes_of_an_attempt_that_was_ended_do_not_touch_
a_later_claim_by_the_same_worker``); ``claim(start=1)``, ``start`` counting once and a row
claimed ahead given back unstarted (tests/unit/test_worker.py
``test_a_batch_counts_the_attempt_of_each_job_as_it_starts``); paused queues in claims
(tests/unit/operations/test_pausing.py); ``"*"`` in the queue list (tests/unit/test_worker.py);
per-queue caps (tests/unit/test_queue_caps.py); relaxed acks (tests/unit/test_pipeline.py).
"""

from __future__ import annotations

import datetime
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard import batch, operations, queue
from django_jobguard.dialects import dialect_for
from django_jobguard.durations import Due
from django_jobguard.envelope import Envelope
from django_jobguard.models import Batch, FailedJob, QueuedJob
from django_jobguard.queue import NewJob
from tests.support import jobs, make_due

pytestmark = pytest.mark.django_db

MS = datetime.timedelta(milliseconds=1)
SECOND = datetime.timedelta(seconds=1)


class ServiceDown(Exception):
    """What a job raises in these tests."""


def _dispatch(n: int = 1, *, queue_name: str = "default", priority: int = 0) -> list[str]:
    return [str(jobs.Noop(i).dispatch(queue=queue_name, priority=priority).id)
            for i in range(n)]


def _db_now() -> datetime.datetime:
    return dialect_for("default").now()


def _row(row: QueuedJob) -> QueuedJob:
    return QueuedJob.objects.get(id=row.id)


def _taken_over(row: QueuedJob) -> QueuedJob:
    """``row``'s lease runs out and worker w2 claims it: the ``row`` its first worker holds
    is now stale."""
    QueuedJob.objects.filter(id=row.id).update(available_at=_db_now() - SECOND)
    (taken,) = queue.claim([row.queue], worker_id="w2")
    assert taken.id == row.id and taken.reserved_by == "w2"
    return taken


def _raised(exception: BaseException) -> BaseException:
    try:
        raise exception
    except BaseException as caught:
        return caught


# -- push ------------------------------------------------------------------------------------


def test_push_inserts_every_job_one_statement_per_batch():
    new = [NewJob(name=jobs.Noop.name, queue="default",
                  payload=Envelope(args=[n]).encode(), priority=n) for n in range(5)]
    with CaptureQueriesContext(connection) as queries:
        queue.push(new, batch_size=2)
    inserts = [q for q in queries.captured_queries if "INSERT INTO" in q["sql"].upper()
               and QueuedJob._meta.db_table in q["sql"]]
    assert len(inserts) == 3
    rows = {row.id: row for row in QueuedJob.objects.all()}
    assert {job.id for job in new} == set(rows)
    assert [rows[job.id].payload["args"] for job in new] == [[0], [1], [2], [3], [4]]
    assert [rows[job.id].priority for job in new] == [0, 1, 2, 3, 4]


def test_push_of_nothing_or_with_a_batch_size_below_one_still_works():
    queue.push([])
    assert not QueuedJob.objects.exists()
    queue.push([NewJob(name=jobs.Noop.name, queue="default", payload='{"args":[]}')
                for _ in range(2)], batch_size=0)
    assert QueuedJob.objects.count() == 2


def test_exists_and_withdraw_of_pushed_rows():
    kept, withdrawn = _dispatch(2)
    assert queue.exists(kept) and queue.exists(uuid.UUID(withdrawn))
    queue.withdraw([withdrawn])
    assert not queue.exists(withdrawn)
    assert list(QueuedJob.objects.values_list("id", flat=True)) == [uuid.UUID(kept)]
    assert not queue.exists(uuid.uuid4())
    assert queue.exists("not-a-job-id")  # a lock that is no job's is never judged left behind


# -- claim -------------------------------------------------------------------------------------


def test_claim_takes_up_to_limit_from_the_first_queue_that_has_any():
    high = set(_dispatch(2, queue_name="high"))
    default = set(_dispatch(3))
    first = queue.claim(["high", "default"], worker_id="w1", limit=5)
    assert {str(r.id) for r in first} == high  # not topped up from the next queue
    for row in first:
        assert row.reserved_by == "w1" and row.attempts == 1
        assert not queue.claimed_ahead(row)
    second = queue.claim(["high", "default"], worker_id="w1", limit=2)
    assert len(second) == 2 and {str(r.id) for r in second} <= default
    assert len(queue.claim(["high", "default"], worker_id="w1", limit=5)) == 1
    assert queue.claim(["high", "default"], worker_id="w1", limit=5) == []
    assert queue.claim(["nowhere"], worker_id="w1") == []


def test_claimed_rows_go_through_model_init_while_a_post_init_receiver_listens():
    """Claimed rows skip ``Model.__init__`` only while nothing listens to ``post_init`` for
    QueuedJob (asked once per claim): a receiver connected sees every claimed row."""
    from django.db.models.signals import post_init

    _dispatch(3)
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    post_init.connect(receiver, sender=QueuedJob)
    try:
        rows = queue.claim(["default"], worker_id="w1", limit=2)
    finally:
        post_init.disconnect(receiver, sender=QueuedJob)
    assert len(rows) == 2 and all(any(s is r for s in seen) for r in rows)
    seen.clear()
    (last,) = queue.claim(["default"], worker_id="w1", limit=2)
    assert last.reserved_by == "w1" and seen == []


def test_claim_with_start_zero_claims_every_row_ahead_and_counts_none():
    _dispatch(3)
    rows = queue.claim(["default"], worker_id="w", limit=3, start=0)
    assert len(rows) == 3 and all(queue.claimed_ahead(r) for r in rows)
    assert sorted(QueuedJob.objects.values_list("attempts", flat=True)) == [0, 0, 0]
    assert QueuedJob.objects.filter(reserved_by="w").count() == 3


def test_claim_puts_the_rows_started_now_first_then_the_others_by_priority():
    for priority in (0, 10, 5, 1):
        _dispatch(priority=priority)
    rows = queue.claim(["default"], worker_id="w", limit=4, start=1)
    assert [(r.priority, queue.claimed_ahead(r)) for r in rows] == [
        (10, False), (5, True), (1, True), (0, True)]


def test_claim_starts_at_most_limit_and_claims_none_ahead_without_a_backlog():
    _dispatch(5)
    rows = queue.claim(["default"], worker_id="w", limit=3, start=10)
    assert len(rows) == 3 and not any(queue.claimed_ahead(r) for r in rows)
    # Two rows left, fewer than the five to start now: nothing more is claimed ahead.
    rows = queue.claim(["default"], worker_id="w", limit=8, start=5)
    assert len(rows) == 2 and not any(queue.claimed_ahead(r) for r in rows)
    assert set(QueuedJob.objects.values_list("attempts", flat=True)) == {1}


def test_a_row_not_from_a_claim_counts_as_started():
    _dispatch()
    row = QueuedJob.objects.get()
    assert not queue.claimed_ahead(row)
    assert queue.start(row) is True
    assert _row(row).attempts == 0  # start() had nothing to count


# -- start -------------------------------------------------------------------------------------


def test_start_of_a_row_another_worker_took_changes_nothing():
    _dispatch()
    (ahead,) = queue.claim(["default"], worker_id="w1", start=0)
    taken = _taken_over(ahead)
    assert queue.start(ahead) is False
    assert queue.claimed_ahead(ahead) and ahead.attempts == 0
    assert _row(ahead).attempts == taken.attempts == 1  # w2's claim counted its own


def test_start_many_counts_each_row_claimed_ahead_once_and_only_rows_still_held():
    _dispatch(4)
    started, *ahead = queue.claim(["default"], worker_id="w1", limit=4, start=1)
    taken = _taken_over(ahead[-1])
    assert queue.start_many([started, *ahead]) == [ahead[-1]]  # not held: not to be run
    assert queue.start_many([started, *ahead]) == [ahead[-1]]  # the rest counted already
    assert [queue.claimed_ahead(r) for r in ahead] == [False, False, True]
    attempts = dict(QueuedJob.objects.values_list("id", "attempts"))
    assert attempts[started.id] == 1  # counted by its claim, not again
    assert [attempts[r.id] for r in ahead[:2]] == [1, 1]
    assert attempts[taken.id] == 1  # w2's claim counted it; w1's start_many did not
    assert queue.ack(ahead[-1]) is False  # and w1's later writes find it is not theirs
    assert queue.start_many([]) == []


def test_a_dialect_given_no_rows_to_start_or_complete_changes_nothing():
    """An empty list names no row: it must not match every row the worker holds."""
    _dispatch(2)
    rows = queue.claim(["default"], worker_id="w1", limit=2, start=0)
    dialect = dialect_for(queue.queue_database(None))
    assert dialect.start_many([], "w1") == set()
    assert dialect.complete([], [], "w1") == (set(), set())
    assert sorted(QueuedJob.objects.values_list("attempts", flat=True)) == [0, 0]
    assert QueuedJob.objects.filter(id__in=[r.id for r in rows]).count() == 2


def test_start_many_is_one_statement_whatever_the_number_of_rows():
    """The coordinator starts every async row given a free slot at once: one UPDATE for all
    of them (on PostgreSQL the ids travel as two arrays), each row owner-checked."""
    _dispatch(5)
    rows = queue.claim(["default"], worker_id="w1", limit=5, start=0)
    taken = _taken_over(rows[0])
    with CaptureQueriesContext(connection) as queries:
        assert queue.start_many(rows) == [rows[0]]  # held by w2: not started here
    writes = [q for q in queries if "UPDATE" in q["sql"].upper()
              and "FOR UPDATE" not in q["sql"].upper()]  # (the base dialect's SELECT locks)
    assert len(writes) == 1
    assert [queue.claimed_ahead(row) for row in rows] == [True, False, False, False, False]
    attempts = dict(QueuedJob.objects.values_list("id", "attempts"))
    assert [attempts[row.id] for row in rows[1:]] == [1, 1, 1, 1]
    assert attempts[taken.id] == taken.attempts == 1  # held by w2: not counted again


# -- ack ---------------------------------------------------------------------------------------


def test_ack_deletes_the_row_and_an_ack_of_another_workers_row_changes_nothing():
    _dispatch(2)
    done, lost = queue.claim(["default"], worker_id="w1", limit=2)
    taken = _taken_over(lost)
    assert queue.ack(done) is True
    assert queue.ack(done) is False  # gone already
    assert queue.ack(lost) is False
    assert _row(lost).reserved_by == "w2" and _row(lost).claims == taken.claims
    assert queue.ack(taken) is True
    assert not QueuedJob.objects.exists()


def test_ack_then_starts_the_row_claimed_ahead_in_the_same_round_trip():
    _dispatch(4)
    first, second, lost, fourth = queue.claim(["default"], worker_id="w1", limit=4, start=1)
    assert queue.ack(first, then=second) is True
    assert not queue.claimed_ahead(second) and second.attempts == 1
    assert _row(second).attempts == 1
    assert queue.start(fourth)
    assert queue.ack(second, then=fourth) is True
    assert _row(fourth).attempts == 1  # started already: not counted again
    _taken_over(lost)
    assert queue.ack(fourth, then=lost) is True  # w1's own row is acked, but
    assert queue.claimed_ahead(lost) and lost.attempts == 0  # w2's is not started by it
    assert _row(lost).attempts == 1  # counted once, by w2's claim


def test_ack_counting_counts_the_success_in_the_batch_only_when_it_acks():
    handle = batch([jobs.Noop(1), jobs.Noop(2), jobs.Noop(3)]).dispatch()
    first, second, third = queue.claim(["default"], worker_id="w", limit=3, start=1)
    assert queue.ack_counting(first, handle.id, then=second) == (True, (2, 0))
    assert not queue.claimed_ahead(second) and _row(second).attempts == 1
    _taken_over(third)
    assert queue.ack_counting(third, handle.id) == (False, None)  # not w's row any more
    assert Batch.objects.get(id=handle.id).pending_jobs == 2
    assert queue.ack_counting(second, handle.id) == (True, (1, 0))
    assert queue.ack_counting(second, handle.id) == (False, None)  # acked already


def test_ack_counting_without_such_a_batch_acks_and_counts_nothing():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w")
    assert queue.ack_counting(row, str(uuid.uuid4())) == (True, None)
    assert not QueuedJob.objects.exists()


# -- release -----------------------------------------------------------------------------------


def test_release_makes_the_row_claimable_again_when_due_and_says_why_it_waits():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w")
    before = _db_now()
    assert queue.release(row, due=Due(delay=600), wait_reason="circuit 'sms' was open")
    after = _db_now()
    released = _row(row)
    assert released.reserved_by == "" and released.reserved_at is None
    assert before - MS <= released.available_at - datetime.timedelta(seconds=600) <= after + MS
    assert released.wait_reason == "circuit 'sms' was open"
    assert released.attempts == 1  # the run used its attempt
    assert queue.claim(["default"], worker_id="w") == []  # not due yet


def test_release_at_an_absolute_time_or_now():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w")
    at = (_db_now() + datetime.timedelta(hours=2)).replace(microsecond=0)
    assert queue.release(row, due=Due(at=at), wait_reason="x" * 300)
    assert _row(row).available_at == at
    assert len(_row(row).wait_reason) == 255  # cut to the column
    make_due()
    (again,) = queue.claim(["default"], worker_id="w")
    assert queue.release(again)  # due now, reason cleared
    assert _row(row).wait_reason == ""
    assert [r.id for r in queue.claim(["default"], worker_id="w")] == [row.id]


def test_release_without_counting_the_attempt_gives_it_back():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w")
    assert _row(row).attempts == 1
    assert queue.release(row, count_attempt=False)  # a deferral
    assert _row(row).attempts == 0


def test_release_with_the_jobs_exception_keeps_it_and_counts_it_unless_handled():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w")
    assert queue.release(row, exception=_raised(ServiceDown("Twilio: 503")))
    released = _row(row)
    assert released.exceptions == 1
    assert released.last_error.startswith(f"{__name__}.ServiceDown: Twilio: 503\n\n")
    assert "Traceback (most recent call last)" in released.last_error
    (again,) = queue.claim(["default"], worker_id="w")
    assert queue.release(again, exception=ServiceDown("handled"), count_exception=False)
    released = _row(row)
    assert released.exceptions == 1  # a middleware handled it: not counted
    assert released.last_error.startswith(f"{__name__}.ServiceDown: handled")


def test_release_of_another_workers_row_changes_nothing():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w1")
    taken = _taken_over(row)
    assert queue.release(row, due=Due(delay=600), count_attempt=False,
                         exception=ServiceDown("late"), wait_reason="late") is False
    kept = _row(row)
    assert (kept.reserved_by, kept.claims, kept.attempts) == ("w2", taken.claims, 2)
    assert kept.exceptions == 0 and kept.last_error == "" and kept.wait_reason == ""


# -- fail --------------------------------------------------------------------------------------


def test_fail_moves_the_row_to_failed_jobs_with_the_reason_and_the_last_error():
    jobs.Noop(7).dispatch(queue="mail", priority=3)
    (row,) = queue.claim(["mail"], worker_id="w")
    assert queue.release(row, exception=_raised(ServiceDown("Twilio: 503")))
    (row,) = queue.claim(["mail"], worker_id="w")
    error = _raised(RuntimeError("gave up"))
    returned = queue.fail(row, error, reason="its last try (2 of 2) raised")
    assert not QueuedJob.objects.exists()
    failed = FailedJob.objects.get()
    assert failed == returned
    assert (failed.id, failed.queue, failed.name) == (row.id, "mail", jobs.Noop.name)
    assert (failed.payload["args"], failed.attempts, failed.priority) == ([7], 2, 3)
    assert failed.exception_class == "builtins.RuntimeError" and failed.message == "gave up"
    assert "Traceback (most recent call last)" in failed.traceback
    assert "_raised" in failed.traceback
    assert failed.reason == "its last try (2 of 2) raised"
    assert failed.last_error.startswith(f"{__name__}.ServiceDown: Twilio: 503")  # the row's


def test_fail_with_a_last_error_given_and_a_reason_cut_to_the_column():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w")
    failed = queue.fail(row, RuntimeError("x"), reason="r" * 600, last_error="its own")
    failed.refresh_from_db()
    assert failed.last_error == "its own" and failed.reason == "r" * 500
    assert failed.traceback == "RuntimeError: x\n"  # never raised: no frames


def test_fail_of_another_workers_row_changes_nothing():
    _dispatch()
    (row,) = queue.claim(["default"], worker_id="w1")
    _taken_over(row)
    assert queue.fail(row, RuntimeError("late"), reason="late") is None
    assert not FailedJob.objects.exists()
    assert _row(row).reserved_by == "w2"


# -- leases ------------------------------------------------------------------------------------


def test_extend_leases_pushes_back_only_the_workers_own_rows(settings):
    _dispatch(4)
    mine = queue.claim(["default"], worker_id="w1", limit=2)
    (theirs,) = queue.claim(["default"], worker_id="w2")
    (waiting,) = QueuedJob.objects.filter(reserved_by="")
    unchanged = {r.id: r.available_at for r in (theirs, waiting)}
    settings.JOBGUARD = {**settings.JOBGUARD, "RETRY_AFTER": 3600}
    before = _db_now()
    assert queue.extend_leases("w1") == 2
    after = _db_now()
    hour = datetime.timedelta(hours=1)
    for row in mine:
        assert before - MS <= _row(row).available_at - hour <= after + MS
    assert {r.id: _row(r).available_at for r in (theirs, waiting)} == unchanged


def test_extend_leases_of_given_ids_only(settings):
    _dispatch(2)
    working, done = queue.claim(["default"], worker_id="w1", limit=2)
    settings.JOBGUARD = {**settings.JOBGUARD, "RETRY_AFTER": 3600}
    assert queue.extend_leases("w1", ids=[working.id]) == 1
    assert _row(working).available_at > _row(done).available_at + datetime.timedelta(
        minutes=30)
    assert queue.extend_leases("w1", ids=[]) == 0
    assert queue.extend_leases("nobody") == 0


# -- while a job runs --------------------------------------------------------------------------


def test_only_a_reserved_job_can_be_asked_to_stop():
    waiting, running = _dispatch(2)
    QueuedJob.objects.filter(id=waiting).update(priority=-1)  # claim the other one
    (row,) = queue.claim(["default"], worker_id="w")
    assert str(row.id) == running
    assert not queue.cancel_requested(running)
    assert queue.request_cancel(waiting) is False
    assert queue.request_cancel(running) is True
    assert queue.cancel_requested(running)
    assert not queue.cancel_requested(waiting)
    assert queue.request_cancel(uuid.uuid4()) is False
    assert not queue.cancel_requested(uuid.uuid4())


# -- paused queues and what is due --------------------------------------------------------------


def test_paused_lists_all_paused_queues_or_those_asked_about():
    operations.pause("mail", force=True)
    operations.pause("sms", force=True)
    assert queue.paused() == {"mail", "sms"}
    assert queue.paused(["mail", "default"]) == {"mail"}
    assert queue.paused(["default"]) == set()
    assert queue.paused([]) == set()


def test_seconds_until_due_and_next_due_of_the_earliest_row():
    assert queue.seconds_until_due(["default"]) is None
    assert queue.next_due(["default"]) is None
    jobs.Noop(1).dispatch(delay=600)
    jobs.Noop(2).dispatch(delay=900)
    jobs.Noop(3).dispatch(queue="other")  # due now, in a queue not asked about
    earliest = QueuedJob.objects.order_by("available_at").filter(queue="default").first()
    assert earliest.payload["args"] == [1]
    assert queue.next_due(["default"]) == earliest.available_at
    before = _db_now()
    seconds = queue.seconds_until_due(["default"])
    after = _db_now()
    # measured against the database's now during the query
    assert (earliest.available_at - after - MS).total_seconds() <= seconds
    assert seconds <= (earliest.available_at - before + MS).total_seconds()
    assert queue.seconds_until_due(["other"]) <= 0
    assert queue.seconds_until_due(["default", "other"]) <= 0


def test_after_a_job_only_the_connections_it_broke_are_closed_whichever_alias():
    """``close_broken_connections()`` (after every job) keeps each thread's connection
    wrappers (one per alias, a tenth of a no-op job's CPU otherwise): it still closes a
    broken connection of an alias the thread first used after the wrappers were kept, and
    leaves a usable one (errors caught by the job) and one inside a transaction open."""
    import threading

    from django.db import connections

    closed: list[str] = []

    def in_a_worker_thread() -> None:
        queue.close_broken_connections()  # the thread's wrappers are kept from here
        for alias in connections:
            conn = connections[alias]
            conn.connection = object()  # "open" from here (no real connection needed)
            conn.close = lambda alias=alias: closed.append(alias)
            conn.errors_occurred = True
        connections["queue"].is_usable = lambda: False  # broken
        connections["default"].is_usable = lambda: True  # the job caught its error
        queue.close_broken_connections()
        connections["default"].is_usable = lambda: False
        connections["default"].in_atomic_block = True  # a test's transaction: left alone
        queue.close_broken_connections()
        for alias in connections:
            connections[alias].connection = None

    thread = threading.Thread(target=in_a_worker_thread)
    thread.start()
    thread.join()
    assert closed == ["queue", "queue"]
