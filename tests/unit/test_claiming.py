"""Adaptive claiming: one row without a backlog, more per round trip with one."""

from __future__ import annotations

import pytest

from django_jobguard import queue
from django_jobguard.models import QueuedJob
from django_jobguard.worker import Worker, WorkerOptions
from django_jobguard.worker.claiming import MAX_CLAIM, ClaimSize
from tests.support import jobs, work


def test_a_full_claim_doubles_the_next_up_to_the_most():
    size = ClaimSize()
    asked = []
    for _ in range(9):
        asked.append(size.next())
        size.claimed(asked[-1], asked[-1])  # the queue had as many as asked: a backlog
    assert asked == [1, 2, 4, 8, 16, 32, 64, 128, 128] and MAX_CLAIM == 128


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
