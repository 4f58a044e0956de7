"""The completion group's deferred starts (issue 29, worker/completer.py): a start is written
once its row has run for a window, so rows that only wait for a thread or the event loop
keep their ack in the group."""

from __future__ import annotations

import uuid

import pytest
from django.db import OperationalError

from django_jobguard import queue
from django_jobguard.models import QueuedJob
from django_jobguard.worker import completer as completer_module
from django_jobguard.worker.completer import Completer

WINDOW = 0.05


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Dialect:
    """Records what each group writes; every row is still the worker's."""

    def __init__(self) -> None:
        self.groups: list[tuple[list, list]] = []

    taken: set = set()  # ids another worker holds

    def complete(self, done, starts, reserved_by, *, relaxed=False):
        self.groups.append(([job_id for job_id, _ in done], [job_id for job_id, _ in starts]))
        return ({job_id for job_id, _ in done} - self.taken,
                {job_id for job_id, _ in starts} - self.taken)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(completer_module.time, "monotonic", clock)
    monkeypatch.setattr(completer_module.clock, "lease_clock", clock)
    return clock


@pytest.fixture
def group(clock):
    group = Completer(worker_id="w", using="default", window=WINDOW, batch_size=100,
                      dialect=Dialect())
    group._timer = object()  # no timer thread: the test writes the groups itself
    group.ran("tests.Fast", 0.001)  # a fast class: its next starts may be deferred
    return group


def _row() -> QueuedJob:
    row = QueuedJob(id=uuid.uuid4(), name="tests.Fast", queue="default", claims=1, attempts=0,
                    reserved_by="w")
    row.attempt_counted, row.recovered = False, False  # claimed ahead, not recovered
    row.held_until = float("inf")  # claimed just now (its lease surely holds)
    return row


def test_a_start_younger_than_the_window_waits_and_its_ack_stays_in_the_group(group, clock):
    row = _row()
    assert group.start(row) and row.attempts == 1  # deferred: the job sees its attempt
    group.flush()  # e.g. a group written for others while this row waits for the loop
    assert group._dialect.groups == []
    assert group.groups(row)  # its ack may still join a group
    clock.now += WINDOW / 2
    group.flush()
    assert group._dialect.groups == [] and group.groups(row)


def test_a_start_is_written_by_the_first_group_after_it_ran_for_a_window(group, clock):
    slow, young = _row(), _row()
    group.start(slow)
    clock.now += WINDOW
    group.start(young)
    assert group._since == 1000.0  # the timer writes the group a window after the oldest
    group.flush()
    assert group._dialect.groups == [([], [slow.id])]
    assert not group.groups(slow)  # its attempt is written: acked on its own
    assert group.groups(young) and group._since == 1000.0 + WINDOW  # the next group's time
    clock.now += WINDOW
    group.flush()
    assert group._dialect.groups[-1] == ([], [young.id])



def test_a_row_held_for_over_half_its_lease_has_its_start_written_now(group, clock,
                                                                       settings):
    """After a stall (or a long wait in a buffer) another worker may hold the row: its
    start goes out owner-checked with the group, not deferred, and one taken over is not
    run here (``start`` is False)."""
    settings.JOBGUARD = {"RETRY_AFTER": 90}
    fresh, held_long, taken = _row(), _row(), _row()
    fresh.held_until = clock.now + 60  # claimed 30 s ago: over half its lease left
    held_long.held_until = taken.held_until = clock.now + 40  # claimed 50 s ago
    group._dialect.taken = {taken.id}
    assert group.start(fresh) and group.groups(fresh)  # deferred
    assert group.start(held_long) and not group.groups(held_long)  # written now
    assert group._dialect.groups == [([], [held_long.id])] and held_long.attempts == 1
    assert group.start(taken) is False and not group.groups(taken)
    assert taken.attempts == 0
    del settings.JOBGUARD
    bare = _row()
    del bare.held_until  # not from a claim that tells
    assert not group.defers(bare)


def test_join_takes_an_ack_only_while_its_start_waits_in_the_group(group, clock):
    """:meth:`Completer.join` asks :meth:`groups` and adds under one lock: a row whose
    start was written on its own (it ran for a window) is acked on its own."""
    from django_jobguard.outcome import Outcome
    from django_jobguard.worker.completer import Finished

    deferred, written = _row(), _row()
    group.start(deferred)
    group.start(written)
    clock.now += WINDOW
    group.flush()  # both ran for a window: their starts are written
    assert group._dialect.groups == [([], [deferred.id, written.id])]
    late = _row()
    group.start(late)

    def entry(row):
        return Finished(row, None, Outcome.done(), 0.0, acked=lambda e: None,
                        lost=lambda e: None)

    assert not group.join(entry(written)) and group._finished == []
    assert group.join(entry(late)) and [e.row for e in group._finished] == [late]
    assert not group.groups(late)  # its start now goes with its ack
    group.flush()
    assert group._dialect.groups[-1] == ([late.id], [])

def test_stopping_writes_every_deferred_start(group, clock):
    rows = [_row(), _row()]
    for row in rows:
        group.start(row)
    group._timer = None
    group.close()
    assert group._dialect.groups == [([], [row.id for row in rows])]


class Cut(Dialect):
    """A group write that meets a cut connection."""

    def complete(self, done, starts, reserved_by, *, relaxed=False):
        raise OperationalError("terminating connection due to administrator command")


def test_a_start_whose_group_was_not_written_is_counted_by_its_own_write(group, clock):
    # A start taken out for a group that failed was written nowhere: the row's own write (a
    # release after an exception) must count it, as after take_start(), not take it as done.
    row = _row()
    group.start(row)
    clock.now += WINDOW
    group._dialect = Cut()
    assert group.flush() is False
    assert queue.claimed_ahead(row) and not group.groups(row)  # acked on its own, counting it


def test_a_full_group_is_written_by_the_timer_thread_and_the_next_by_its_job_thread():
    """A full group does not hold up the thread whose job filled it: the timer thread writes
    it. While that statement runs, the next full group is written by the thread that filled
    it (at most two groups in flight, never more held)."""
    import threading

    from django_jobguard.worker.completer import Finished

    writing, release = threading.Event(), threading.Event()
    writers: list[tuple[str, list]] = []

    class Slow(Dialect):
        def complete(self, done, starts, reserved_by, *, relaxed=False):
            writers.append((threading.current_thread().name, [job_id for job_id, _ in done]))
            if len(writers) == 1:  # the first group's statement takes its time
                writing.set()
                assert release.wait(10)
            return super().complete(done, starts, reserved_by, relaxed=relaxed)

    group = Completer(worker_id="w", using="default", window=60.0, batch_size=3)
    group._dialect = Slow()
    acked: list = []

    group.ran("tests.Fast", 0.001)

    def finish() -> QueuedJob:
        row = _row()
        assert group.start(row)  # deferred: its ack may join the group
        assert group.join(Finished(row, None, None, 0.0, acked=acked.append,
                                   lost=acked.append))
        return row

    try:
        first = [finish() for _ in range(3)]  # full: returns without writing it
        assert writing.wait(10)
        assert writers[0][0].startswith("jobguard-completer")
        second = [finish() for _ in range(3)]  # full while the first is written: written here
        assert writers[1] == (threading.current_thread().name, [row.id for row in second])
        release.set()
    finally:
        release.set()
        group.close()
    assert writers[0][1] == [row.id for row in first] and len(writers) == 2
    assert sorted(entry.row.id for entry in acked) == sorted(row.id for row in first + second)


class Held(Dialect):
    """A group write that waits for ``go`` (what the test does meanwhile runs in between),
    calling ``during()`` in the writing thread first."""

    def __init__(self, during=lambda: None) -> None:
        super().__init__()
        import threading

        self.writing, self.go, self.during = threading.Event(), threading.Event(), during

    def complete(self, done, starts, reserved_by, *, relaxed=False):
        self.during()
        self.writing.set()
        assert self.go.wait(10)
        return super().complete(done, starts, reserved_by, relaxed=relaxed)


def test_a_per_job_write_waits_for_the_group_statement_writing_its_start(group, clock):
    """A job that ends (released, failed) while the group writes its start takes the group's
    result: had its own write committed first, the group's would have missed the row and the
    attempt would be counted nowhere."""
    import threading

    row = _row()
    group.start(row)
    clock.now += WINDOW
    group._dialect = Held()
    flushing = threading.Thread(target=group.flush)
    flushing.start()
    assert group._dialect.writing.wait(10)
    took = threading.Event()
    taking = threading.Thread(target=lambda: (group.take_start(row), took.set()))
    taking.start()
    assert not took.wait(0.2)  # waits for the group's statement
    group._dialect.go.set()
    assert took.wait(10)
    flushing.join(10)
    assert not queue.claimed_ahead(row)  # written by the group: its release adds nothing


def test_the_thread_writing_a_start_does_not_wait_for_itself(group, clock):
    """A second Ctrl-C's handler runs in the thread it interrupts, which may be writing a
    group: its take_start() must not wait for that write."""
    row = _row()
    group.start(row)
    clock.now += WINDOW
    group._dialect = Held(during=lambda: group.take_start(row))
    group._dialect.go.set()
    assert group.flush() is True and group._dialect.groups == [([], [row.id])]


def test_a_group_lands_only_its_own_starts(group, clock):
    """A group's landing (again once its rows' own work is done) leaves alone a start of the
    same id that a later group writes by then (the row released, claimed again, deferred):
    take_start() still waits for that group."""
    import threading

    from django_jobguard.worker.completer import Finished

    class Scripted(Dialect):
        def __init__(self) -> None:
            super().__init__()
            self.writing, self.go = threading.Event(), threading.Event()

        def complete(self, done, starts, reserved_by, *, relaxed=False):
            if threading.current_thread().name == "held":
                self.writing.set()
                assert self.go.wait(10)
            return super().complete(done, starts, reserved_by, relaxed=relaxed)

    group._dialect = Scripted()
    first, other = _row(), _row()
    group.start(first)
    group.start(other)
    clock.now += WINDOW
    again = _row()
    again.id = first.id

    def acked(entry):  # the first group's per-row work; meanwhile a later group starts
        group.start(again)
        clock.now += WINDOW
        threading.Thread(target=group.flush, name="held").start()
        assert group._dialect.writing.wait(10)

    group.join(Finished(other, None, None, 0.0, acked=acked, lost=lambda e: None))
    group.flush()
    assert first.id in group._in_flight  # the later group's, still writing
    took = threading.Event()
    threading.Thread(target=lambda: (group.take_start(again), took.set())).start()
    waited = not took.wait(0.3)
    group._dialect.go.set()
    assert waited and took.wait(10) and not queue.claimed_ahead(again)


def test_leases_are_timed_on_a_clock_that_counts_a_suspend():
    """A host suspended past a lease must not take the lease as still held on waking:
    Linux's boot-time clock goes on through a suspend, ``time.monotonic()`` does not."""
    import time

    from django_jobguard import clock as clocks

    if hasattr(time, "CLOCK_BOOTTIME"):
        before = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert before <= clocks.lease_clock() <= time.clock_gettime(time.CLOCK_BOOTTIME)
    else:
        assert clocks.lease_clock() <= time.monotonic()
