"""A lock/counter store that cannot be reached, in-process.

The Redis store turns "cannot reach the server" (connection refused or lost, timed out) into
``StoreUnavailableError``. When a middleware's store call raises it before ``handle()`` ran,
the worker puts the job back a few seconds later without using an attempt, logs a warning
naming the store, and pauses (before, a ``tries = 1`` job FAILED without ever running).
Raised by ``handle()`` itself, it stays the job's exception.

No Redis server is needed: the store ``down`` is a django-redis cache on a port where nothing
listens (or, for timeouts, where nothing ever answers). A real Redis restarted under worker
processes is in tests/chaos/test_redis_restart.py.
"""

from __future__ import annotations

import datetime
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from django.test import override_settings
from django.utils import timezone

from django_jobguard import (
    Job,
    Limit,
    RateLimited,
    ShouldBeUnique,
    ThrottlesExceptions,
    WithoutOverlapping,
    rate_limiter,
)
from django_jobguard.conf import jobguard_settings
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from django_jobguard.worker import pipeline as pipeline_module
from tests.support import make_due, store_faults, work
from tests.support.store_faults import redis_refusing, redis_store_at

redis_exceptions = pytest.importorskip("redis.exceptions")
pytest.importorskip("django_redis")

pytestmark = pytest.mark.django_db

ran: list[str] = []

rate_limiter.define("outage-test", lambda job: Limit.per_minute(100))


class GuardedJob(Job):
    """One try. ``guard`` says what asks the store ``store``: a middleware before ``handle()``
    (overlap, rate, circuit, or a circuit around an overlap lock), or ``handle()`` itself."""

    tries = 1

    def __init__(self, guard: str, store: str = "down"):
        self.guard, self.store = guard, store

    def middleware(self):
        overlap = WithoutOverlapping("k", expire_after=10, store=self.store)
        return {
            "overlap": [overlap],
            "rate": [RateLimited("outage-test", store=self.store)],
            "circuit": [ThrottlesExceptions(3, 60, store=self.store)],
            # the circuit's store is up, the lock's store (inside the circuit) is down
            "circuit-around-overlap": [ThrottlesExceptions(1, 60, store="database"), overlap],
            "handle": [],
        }[self.guard]

    def handle(self):
        ran.append(self.guard)
        if self.guard == "handle":
            get_store(self.store).acquire("jobguard:outage-test", "me", ttl=10)


class UniqueOnDown(ShouldBeUnique, Job):
    """A unique job whose lock lives in store ``down``."""

    def unique_via(self) -> str:
        return "down"

    def handle(self):
        ran.append("unique")


BEFORE_HANDLE = ["overlap", "rate", "circuit", "circuit-around-overlap"]


@pytest.fixture(autouse=True)
def _clear_and_no_pause(monkeypatch):
    ran.clear()
    monkeypatch.setattr(pipeline_module, "STORE_OUTAGE_PAUSE", 0.0)


@pytest.fixture
def down() -> Iterator[str]:
    """Store ``down``: Redis on a port that is bound but never listens (connection refused)."""
    with redis_refusing("down") as alias:
        yield alias


@pytest.fixture
def hung() -> Iterator[str]:
    """Store ``down``: Redis on a port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        with redis_store_at(sock.getsockname()[1], "down", SOCKET_CONNECT_TIMEOUT=0.2,
                            SOCKET_TIMEOUT=0.2):
            yield "down"


PRIMITIVES = store_faults.PRIMITIVES


@pytest.mark.parametrize("primitive", sorted(PRIMITIVES))
def test_every_redis_primitive_raises_store_unavailable_when_refused(down, primitive):
    with pytest.raises(StoreUnavailableError, match="store 'down' is unavailable") as caught:
        PRIMITIVES[primitive](get_store(down))
    assert caught.value.store == "down"
    assert isinstance(caught.value.__cause__, redis_exceptions.ConnectionError)


def test_a_redis_that_never_answers_is_unavailable_once_the_socket_times_out(hung):
    with pytest.raises(StoreUnavailableError) as caught:
        get_store(hung).acquire("jobguard:k", "me", ttl=5)
    assert isinstance(caught.value.__cause__, (redis_exceptions.TimeoutError,
                                               redis_exceptions.ConnectionError))


def _outage_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "django_jobguard.worker" and r.levelno == logging.WARNING
            and "unavailable" in r.getMessage()]


@pytest.mark.parametrize("guard", BEFORE_HANDLE)
def test_outage_before_handle_puts_the_job_back_without_using_its_only_try(
        down, guard, caplog, released):
    handle = GuardedJob(guard).dispatch()

    assert work() == ["RELEASED"]
    assert ran == []  # it never ran ...
    row = QueuedJob.objects.get()  # ... so it is still queued, with its one try intact
    assert (row.attempts, row.exceptions, row.last_error) == (0, 0, "")
    assert not FailedJob.objects.exists()
    wait = row.available_at - timezone.now()  # back after the outage delay and its jitter
    low = pipeline_module.STORE_OUTAGE_DELAY - 1
    high = pipeline_module.STORE_OUTAGE_DELAY + pipeline_module.STORE_OUTAGE_JITTER + 1
    assert datetime.timedelta(seconds=low) < wait < datetime.timedelta(seconds=high)
    assert [r["reason"] for r in released] == ["store_unavailable"]
    warnings = _outage_warnings(caplog)
    assert len(warnings) == 1 and "Store 'down' is unavailable" in warnings[0]
    assert str(handle.id) in warnings[0] and "without using an attempt" in warnings[0]
    if guard == "circuit-around-overlap":  # the outage was not counted as the job failing
        assert not get_store("database").throttles()

    # The store is back (here: ``down`` now names the database store): the job runs once.
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "STORES": {
            "down": {"BACKEND": "django_jobguard.stores.database.DatabaseStore"}}}):
        make_due()
        assert work() == ["DONE"]
    assert ran == [guard]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_outage_deferral_uses_no_attempt_even_when_deferrals_consume_attempts(down):
    with override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                     "DEFERRALS_CONSUME_ATTEMPTS": True}):
        GuardedJob("overlap").dispatch()
        assert work() == ["RELEASED"]
    assert QueuedJob.objects.get().attempts == 0


def test_the_worker_pauses_after_each_outage_deferral(down, monkeypatch):
    monkeypatch.setattr(pipeline_module, "STORE_OUTAGE_PAUSE", 0.3)
    for _ in range(3):
        GuardedJob("overlap").dispatch()

    started = time.monotonic()
    assert work() == ["RELEASED"] * 3
    assert time.monotonic() - started >= 3 * 0.3  # not three claims back to back
    assert list(QueuedJob.objects.values_list("attempts", flat=True)) == [0, 0, 0]


def test_outage_inside_handle_is_the_jobs_own_exception(down, caplog):
    """handle() ran (it may have written elsewhere), so the store error counts like any
    exception: with one try the job fails. Delivery stays at-least-once."""
    GuardedJob("handle").dispatch()

    assert work() == ["FAILED"]
    assert ran == ["handle"]
    failed = FailedJob.objects.get()
    assert failed.exception_class == "django_jobguard.exceptions.StoreUnavailableError"
    assert "store 'down' is unavailable" in failed.message
    assert not _outage_warnings(caplog)


def test_a_unique_dispatch_raises_to_the_caller_and_queues_nothing(down):
    with pytest.raises(StoreUnavailableError):
        UniqueOnDown().dispatch()
    assert not QueuedJob.objects.exists()


class CircuitJob(Job):
    """One try, a circuit in the database store, and a handle() that succeeds."""

    tries = 1

    def middleware(self):
        return [ThrottlesExceptions(3, 60, store="database")]

    def handle(self):
        ran.append("circuit-success")


def test_a_success_the_circuit_cannot_record_still_stands(monkeypatch, caplog):
    """The store goes away between handle() and recording the success on the circuit: the
    job is done (not retried, not failed), and the worker says what it could not record."""
    from django_jobguard.stores.database import DatabaseStore

    def leave_fails(self, key, **kwargs):
        raise StoreUnavailableError(self.alias, "connection refused")

    monkeypatch.setattr(DatabaseStore, "circuit_leave", leave_fails)
    CircuitJob().dispatch()

    assert work() == ["DONE"]
    assert ran == ["circuit-success"]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert any("could not record it" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
