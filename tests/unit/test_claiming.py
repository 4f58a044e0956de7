"""Adaptive claiming: one row without a backlog, more per round trip with one."""

from __future__ import annotations

import pytest

from django_jobguard import queue
from django_jobguard.models import QueuedJob
from django_jobguard.worker import Worker, WorkerOptions, claiming
from django_jobguard.worker.claiming import MAX_CLAIM, ClaimSize
from tests.support import jobs, requires_postgres, work


def test_a_full_claim_doubles_the_next_up_to_the_most():
    size = ClaimSize()
    asked = []
    for _ in range(11):
        asked.append(size.next())
        size.claimed(asked[-1], asked[-1])  # the queue had as many as asked: a backlog
    assert asked == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 512] and MAX_CLAIM == 512


def test_a_short_claim_goes_back_to_one():
    size = ClaimSize()
    size.claimed(1, 1)
    size.claimed(2, 2)
    assert size.next() == 4
    size.claimed(4, 3)  # the backlog ran out
    assert size.next() == 1
    size.claimed(1, 0)
    assert size.next() == 1


def test_long_jobs_are_claimed_one_at_a_time_even_with_a_backlog():
    size = ClaimSize()
    for _ in range(5):
        size.claimed(size.next(), size.next())
    size.finished(1.0)  # one-second jobs: claiming ahead would only keep them from idle peers
    assert size.next() == 1
    for _ in range(30):
        size.finished(0.005)  # then 5 ms jobs: 50 ms of work ahead is 10 of them
    assert 8 <= size.next() <= 10


def test_a_batch_is_fast_when_it_ends_within_the_ahead_seconds_at_the_average():
    size = ClaimSize(fixed=8)
    assert not size.fast(8)  # no job ended yet: nothing is known
    size.finished(0.005)
    assert size.fast(8) and not size.fast(11)  # 40 ms of work, then 55 ms
    size.finished(1.0)  # a slow job moves the average past 50 ms / 8
    assert not size.fast(8)


def test_a_fixed_size_never_changes():
    size = ClaimSize(fixed=5)
    size.claimed(5, 0)
    size.finished(10.0)
    assert size.next() == 5


@pytest.mark.django_db
def test_the_default_worker_claims_several_per_round_trip_with_a_backlog(monkeypatch):
    for n in range(40):
        jobs.Noop(n).dispatch()
    limits: list[tuple[int, int]] = []
    real_claim = queue.claim

    def spy(*args, **kwargs):
        rows = real_claim(*args, **kwargs)
        limits.append((kwargs["limit"], len(rows)))
        return rows

    monkeypatch.setattr(queue, "claim", spy)
    states: list[str] = []
    worker = Worker(WorkerOptions(stop_when_empty=True, sleep=0, memory=0),
                    log=lambda line, state: states.append(state))
    # However slow a loaded machine makes these no-ops, let only the backlog decide the size
    # (the cap by job duration is tested above).
    worker._claim_size.ahead_seconds = 3600.0
    assert worker.run() == 0
    assert [s for s in states if s != "RUNNING"] == ["DONE"] * 40
    assert limits[:4] == [(1, 1), (2, 2), (4, 4), (8, 8)]
    assert len(limits) < 12  # 40 jobs in a handful of round trips, not 40
    assert limits[-1][1] == 0  # and the empty queue is asked for one
    assert limits[-1][0] <= 16
    assert not QueuedJob.objects.exists()


@pytest.mark.django_db
def test_without_a_backlog_the_worker_claims_one():
    jobs.Noop(1).dispatch()
    worker = Worker(WorkerOptions(stop_when_empty=True, sleep=0, memory=0))
    assert len(worker._claim()) == 1
    assert worker._claim() == []
    assert worker._claim_size.next() == 1


@pytest.mark.django_db
def test_jobs_started_by_the_ack_before_them_count_one_attempt_each(monkeypatch):
    from demo.models import JobRun

    from django_jobguard.dialects import dialect_for

    for n in range(6):
        jobs.Record("batch", key=str(n)).dispatch()
    dialect = dialect_for("default")
    calls = []
    real = dialect.ack_and_start
    monkeypatch.setattr(dialect, "ack_and_start",
                        lambda *a, **kw: calls.append(a) or real(*a, **kw))
    assert work(batch=6, tries=1) == ["DONE"] * 6  # each ran on its first and only try
    assert sorted(JobRun.objects.values_list("attempt", flat=True)) == [1] * 6
    assert len(calls) == 5  # the ack of each of the first five started the next


# -- the next claim made while a batch runs (ClaimAhead, PostgreSQL) ------------------------


def _spy_claims(monkeypatch) -> list[dict]:
    """Record each claim: the thread it ran on, what it asked for and how many rows came."""
    import threading

    calls: list[dict] = []
    real_claim = queue.claim

    def spy(*args, **kwargs):
        rows = real_claim(*args, **kwargs)
        calls.append({"thread": threading.current_thread().name, "limit": kwargs["limit"],
                      "start": kwargs["start"], "ahead": kwargs["ahead"], "got": len(rows)})
        return rows

    monkeypatch.setattr(queue, "claim", spy)
    return calls


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_backlog_is_claimed_on_the_claim_thread_while_each_batch_runs(monkeypatch):
    from demo.models import JobRun

    for n in range(60):
        jobs.Record("meanwhile", key=str(n)).dispatch()
    # Every batch of 8 counts as fast however loaded the machine is (in .ci/run a Record
    # job once took over the 6 ms that 50 ms / 8 allows); the threshold has its own test.
    monkeypatch.setattr(claiming, "AHEAD_SECONDS", 60.0)
    calls = _spy_claims(monkeypatch)
    assert work(batch=8, tries=1) == ["DONE"] * 60
    meanwhile = [c for c in calls if c["thread"].startswith("jobguard-claim")]
    # After the first full batch every next one was claimed while the one before ran: all
    # of it ahead (attempts uncounted, nothing from a capped queue).
    assert len(meanwhile) >= 6, calls
    assert all(c["start"] == 0 and c["ahead"] == c["limit"] == 8 for c in meanwhile)
    runs = list(JobRun.objects.filter(label="meanwhile"))
    assert sorted(int(r.key) for r in runs) == list(range(60))  # each ran, and once
    assert {r.attempt for r in runs} == {1}  # each used its one try, none more
    assert not QueuedJob.objects.exists()


@requires_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 4])
def test_the_last_ack_of_a_batch_starts_the_first_row_claimed_meanwhile(monkeypatch, batch):
    # The claim made while a batch ran is waited for as the batch's last job is acked, and
    # that ack starts its first row: no start of its own (at --batch 1, for every job).
    from demo.models import JobRun

    from django_jobguard.dialects import dialect_for

    total = 13
    for n in range(total):
        jobs.Record("chained", key=str(n)).dispatch()
    monkeypatch.setattr(claiming, "AHEAD_SECONDS", 60.0)  # every batch counts as fast
    calls = _spy_claims(monkeypatch)
    dialect = dialect_for("default")
    acks, starts = [], []
    real_ack, real_start = dialect.ack_and_start, dialect.start
    monkeypatch.setattr(dialect, "ack_and_start",
                        lambda *a, **kw: acks.append(a) or real_ack(*a, **kw))
    monkeypatch.setattr(dialect, "start",
                        lambda *a, **kw: starts.append(a) or real_start(*a, **kw))
    assert work(batch=batch, tries=1) == ["DONE"] * total
    runs = list(JobRun.objects.filter(label="chained"))
    assert sorted(int(r.key) for r in runs) == list(range(total))  # each ran, and once
    assert {r.attempt for r in runs} == {1}  # its attempt counted once: by a claim or an ack
    meanwhile = [c for c in calls if c["thread"].startswith("jobguard-claim") and c["got"]]
    own = [c for c in calls if not c["thread"].startswith("jobguard-claim") and c["got"]]
    assert meanwhile and all(c["start"] == 0 for c in meanwhile), calls
    # The first row of each of the loop's own claims was counted by that claim; every other
    # row (the rest of its batch, and each row claimed meanwhile) by the ack of the job
    # before it; none by a start of its own.
    assert starts == [] and len(acks) == total - len(own), (len(acks), len(starts), calls)
    assert not QueuedJob.objects.exists()


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_rows_claimed_meanwhile_are_held_and_go_back_unused_when_the_worker_stops():
    from tests.support import wait_for

    handles = [jobs.Noop(n).dispatch() for n in range(5)]
    worker = Worker(WorkerOptions(batch=5, stop_when_empty=True, sleep=0, memory=0))
    assert worker._may_claim_meanwhile()
    worker._claim_meanwhile()
    ids = {str(h.id) for h in handles}
    wait_for(lambda: {str(i) for i in worker.held_ids()} == ids, timeout=10,
             what="the rows claimed meanwhile are held (the heartbeat renews them)")
    assert {str(i) for i in QueuedJob.objects.filter(reserved_by=worker.id).values_list(
        "id", flat=True)} == ids
    worker.stop()  # before its loop took them: they go back as the worker ends
    assert worker.run() == 0
    rows = QueuedJob.objects.filter(id__in=ids)
    assert rows.count() == 5
    assert all(r.reserved_by == "" and r.attempts == 0 for r in rows)


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_meanwhile_that_fails_is_logged_and_the_worker_claims_itself(
        monkeypatch, caplog):
    import threading

    from django.db import OperationalError

    for n in range(30):
        jobs.Noop(n).dispatch()
    real_claim = queue.claim
    failed = []

    def flaky(*args, **kwargs):
        if threading.current_thread().name.startswith("jobguard-claim") and not failed:
            failed.append(True)
            raise OperationalError("server closed the connection unexpectedly")
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(queue, "claim", flaky)
    assert work(batch=4, tries=1) == ["DONE"] * 30
    assert failed and "Claim ahead failed" in caplog.text
    assert not QueuedJob.objects.exists()


def test_no_claim_meanwhile_inside_a_transaction_or_with_numbered_queues(db):
    # A test's transaction: the claim thread's connection could not see its rows.
    assert not Worker(WorkerOptions(memory=0))._may_claim_meanwhile()


@pytest.mark.django_db
def test_held_ids_finds_a_row_that_moves_on_while_they_are_read():
    """The heartbeat's list of held rows reads the places rows pass through in the order
    they pass: a row taken from the prefetch buffer to run while the list is read is in it
    (read the other way round it was in neither for one beat, its lease not renewed)."""
    jobs.Noop(1).dispatch()
    [claimed] = queue.claim(["default"], worker_id="w", limit=1, start=0)
    worker = Worker(WorkerOptions(sleep=0, memory=0))
    worker._prefetch.put([claimed])

    class Starting(list):
        def __iter__(self):  # the row leaves the buffer and starts as this is read
            items = list(super().__iter__())
            if worker._prefetch.take(is_async=False) is not None:
                self.append(claimed)
            return iter(items)

    worker._running = Starting()
    assert claimed.id in worker.held_ids()
    assert list(worker._running) == [claimed]  # it did move on while the list was read


@pytest.mark.django_db(transaction=True)
def test_rows_starting_from_the_buffer_are_held_while_their_starts_are_written(monkeypatch):
    """Rows taken from the prefetch buffer to start (``--threads``, async) are held while
    ``queue.start_many`` writes their starts (a round trip: a beat may come meanwhile)."""
    from django_jobguard.worker import loop as loop_module

    for n in range(2):
        jobs.Noop(n).dispatch()
    worker = Worker(WorkerOptions(queues=["default"], threads=2, sleep=0, memory=0))
    worker._executor = worker._threads(2)  # as run() makes it
    claimed = queue.claim(["default"], worker_id=worker.id, limit=2, start=0, ahead=2)
    for row in claimed:
        row.__dict__.pop("held_until", None)  # their starts are written, not deferred
    worker._prefetch.put(claimed)
    seen = {}
    real = queue.start_many

    def start_many(rows, **kwargs):
        seen["held"] = worker.held_ids()  # the heartbeat beating during the statement
        return real(rows, **kwargs)

    monkeypatch.setattr(loop_module.queue, "start_many", start_many)
    monkeypatch.setattr(worker._executor, "submit", lambda row, then=None: None)
    try:
        worker._start_from_buffer()
    finally:
        worker._executor.shutdown()
    assert {row.id for row in claimed} <= seen["held"]
    assert worker._starting == []  # handed on


@pytest.mark.django_db
def test_the_solo_worker_shows_a_row_running_before_it_leaves_the_waiting_rows(monkeypatch):
    """The solo worker's next row is held at every moment: shown running, then taken out
    of the rows waiting."""
    jobs.Noop(1).dispatch()
    worker = Worker(WorkerOptions(sleep=0, memory=0))
    rows = queue.claim(["default"], worker_id=worker.id, limit=1, start=0)
    seen = []
    monkeypatch.setattr(worker._executor, "submit",
                        lambda row, then=None: seen.append(worker.held_ids()))
    worker._hand_out(rows)
    assert seen == [frozenset({rows[0].id})]


@pytest.mark.django_db(transaction=True)
def test_a_thread_taking_its_next_row_from_the_buffer_is_held_meanwhile(monkeypatch):
    """A ``--threads`` slot takes its next row from the buffer under its executor's lock,
    which the heartbeat's read of the executor's rows takes too: a beat during the take finds
    the row (before, it read the rows shown running without the lock, and missed it)."""
    import threading
    import time

    from django_jobguard.worker.executor import _Running

    jobs.Noop(1).dispatch()
    jobs.Noop(2).dispatch()
    worker = Worker(WorkerOptions(queues=["default"], threads=2, sleep=0, memory=0))
    executor = worker._executor = worker._threads(2)
    running, claimed = queue.claim(["default"], worker_id=worker.id, limit=2, start=0, ahead=2)
    worker._prefetch.put([claimed])
    beat: dict = {}
    real_take = worker._prefetch.take

    def take(**kwargs):  # the heartbeat beats as the slot takes its row (under its lock)
        row = real_take(**kwargs)
        heartbeat = threading.Thread(target=lambda: beat.update(held=worker.held_ids()))
        heartbeat.start()
        heartbeat.join(0.5)  # it reads the buffer (empty now), then waits for the lock
        beat["thread"] = heartbeat
        return row

    monkeypatch.setattr(worker._prefetch, "take", take)
    slot = executor._idle.pop()
    try:
        with executor._cond:  # the slot's job runs
            executor._busy[slot] = slot.running = _Running(running, time.monotonic())
            executor._publish()
        assert executor._take_for(slot) is claimed
        beat["thread"].join(10)
        assert {running.id, claimed.id} <= beat["held"]
    finally:
        with executor._cond:
            executor._busy.pop(slot, None)
            slot.running = slot.following = None
            executor._idle.append(slot)
        executor.shutdown()
