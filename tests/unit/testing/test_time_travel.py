"""The test clock: every guard and the queue see the advanced "now", on both stores; nothing
sleeps (each wait is a clock.advance)."""

from __future__ import annotations

import datetime

import pytest

from django_jobguard import clock as jobguard_clock
from django_jobguard import dialects, get_store
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.testing import TestClock, clock, drain
from tests.support.testing_jobs import (
    GATEWAY,
    RAN,
    BackoffJob,
    CircuitJob,
    DeadlineJob,
    OverlapJob,
    RateJob,
    UniqueForJob,
)


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()
    GATEWAY["up"] = False
    yield
    assert jobguard_clock.offset() == 0  # every test clock was stopped


# -- bad input ---------------------------------------------------------------------------------


def test_going_back_is_a_value_error():
    with clock() as c:
        with pytest.raises(ValueError, match="only moves forward"):
            c.advance(-1)
        with pytest.raises(ValueError, match="only moves forward"):
            c.advance(minutes=-5)
        with pytest.raises(TypeError, match="seconds or a timedelta"):
            c.advance("5m")
        assert c.advanced == datetime.timedelta()


def test_entering_twice_is_a_clear_error():
    with clock() as c:
        with pytest.raises(RuntimeError, match="already running"), clock():
            pass
        with pytest.raises(RuntimeError, match="already running"):
            c.__enter__()
    with pytest.raises(RuntimeError, match="used already"), c:
        pass
    with pytest.raises(RuntimeError, match="needs the test clock to be running"):
        TestClock().advance(1)


@pytest.mark.django_db
def test_advance_moves_python_and_database_now():
    before = dialects.dialect_for("default").now()
    with clock() as c:
        moved = c.advance(hours=2, minutes=30)
        assert c.advanced == datetime.timedelta(hours=2, minutes=30)
        assert moved - before >= datetime.timedelta(hours=2, minutes=30)
        db_now = dialects.dialect_for("default").now()
        assert datetime.timedelta(hours=2, minutes=29) < db_now - before \
            < datetime.timedelta(hours=2, minutes=31)
    assert dialects.dialect_for("default").now() - before < datetime.timedelta(minutes=1)


# -- the queue ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_delay_backoff_and_retry_until(jobguard_clock):
    from tests.support.testing_jobs import SyncStock

    SyncStock(1).dispatch(delay=datetime.timedelta(minutes=5))
    assert drain().total == 0
    jobguard_clock.advance(minutes=5)
    assert drain().done == 1

    BackoffJob().dispatch()
    assert drain().released == 1            # attempt 1 fails: back in 60 s
    jobguard_clock.advance(59)
    assert drain().total == 0
    jobguard_clock.advance(1)
    assert drain().released == 1            # attempt 2 fails: back in 120 s
    jobguard_clock.advance(minutes=2)
    assert drain().done == 1
    assert [r for r in RAN if r[0] == "backoff"] == [("backoff", 1), ("backoff", 2),
                                                     ("backoff", 3)]

    DeadlineJob().dispatch()                # retries every minute for five minutes
    for _ in range(5):
        assert drain().released == 1
        jobguard_clock.advance(minutes=1)
    assert drain().failed == 1
    assert [r for r in RAN if r[0] == "deadline"] == [("deadline", n) for n in range(1, 6)]
    # The sixth claim finds the deadline passed: failed without running.
    assert "retry deadline" in FailedJob.objects.get(name=DeadlineJob.name).reason


# -- the guards, on each store ---------------------------------------------------------------


@pytest.mark.django_db
def test_unique_for_expires_under_the_clock(store_alias):
    with clock() as c:
        assert UniqueForJob("a").dispatch()
        assert not UniqueForJob("a").dispatch()   # the lock lasts 60 s
        c.advance(59)
        assert not UniqueForJob("a").dispatch()
        c.advance(2)
        assert UniqueForJob("a").dispatch()       # it expired: a second copy is queued
    assert QueuedJob.objects.filter(name=UniqueForJob.name).count() == 2


@pytest.mark.django_db
def test_rate_limit_the_sixth_call_in_a_minute_waits(store_alias):
    with clock() as c:
        for n in range(6):
            RateJob(n).dispatch()
        result = drain()
        assert (result.done, result.released) == (5, 1)   # the sixth waits for the window
        assert drain().total == 0                          # and is not due yet
        c.advance(59)
        assert drain().total == 0
        c.advance(minutes=1)                               # the window (and its jitter) passed
        assert drain().done == 1
    assert sorted(n for kind, n in RAN) == [0, 1, 2, 3, 4, 5]
    assert QueuedJob.objects.count() == 0


@pytest.mark.django_db
def test_overlap_release_after_and_expire_after(store_alias):
    store = get_store(store_alias)
    with clock() as c:
        key = OverlapJob("r").middleware()[0].lock_key(OverlapJob("r"))
        assert store.acquire(key, "a-killed-worker", ttl=60)   # expire_after=60
        OverlapJob("r").dispatch()
        assert drain().released == 1          # the key is taken: back in 30 s (release_after)
        c.advance(29)
        assert drain().total == 0
        c.advance(1)
        assert drain().released == 1          # due again, but the dead worker's lock holds
        c.advance(31)                         # 61 s: the lock expired (expire_after)
        assert drain().done == 1
    assert RAN == [("overlap", "r")]


@pytest.mark.django_db
def test_circuit_opens_decays_and_half_opens(store_alias):
    with clock() as c:
        CircuitJob(1).dispatch()
        # Failure 1, failure 2 (the circuit opens for 60 s), then deferred while it is open.
        assert drain().states == ["RELEASED"] * 3
        assert len(RAN) == 2
        c.advance(50)
        CircuitJob(2).dispatch()
        assert drain().states == ["RELEASED"]  # 50 s later the circuit is still open
        assert len(RAN) == 2
        GATEWAY["up"] = True
        c.advance(minutes=1)
        assert drain().done == 2              # half-open: the probe succeeds and closes it
    assert RAN[:2] == [("circuit", 1, False), ("circuit", 1, False)]
    assert sorted(RAN[2:]) == [("circuit", 1, True), ("circuit", 2, True)]
