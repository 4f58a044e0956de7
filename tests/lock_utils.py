"""Helpers shared by the lock tests."""

from __future__ import annotations

import datetime
import time

from django.db.models.functions import Now
from django.utils import timezone

from django_jobguard.models import Lock, QueuedJob
from django_jobguard.stores import Store
from django_jobguard.stores.database import DatabaseStore
from django_jobguard.worker import Worker, WorkerOptions


def wait_for(predicate, timeout: float = 30, interval: float = 0.05):
    """Poll until ``predicate()`` is truthy (an event we wait for, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def expire(store: Store, key: str) -> None:
    """Make a held lock expire now, on the store's own terms (no waiting out its ttl)."""
    if isinstance(store, DatabaseStore):
        Lock.objects.using(store.using).filter(key=key).update(
            expires_at=Now() - datetime.timedelta(seconds=1))
    else:
        store.client.pexpire(key, 1)
        wait_for(lambda: not store.client.exists(key), timeout=5, interval=0.002)
    assert store.get_lock(key) is None


def work(queues=("default",), **options) -> list[str]:
    """Run an in-process worker until the queue is empty; returns the states it logged."""
    states: list[str] = []
    options.setdefault("memory", 0)  # pytest's own RSS is not a worker's
    worker = Worker(WorkerOptions(queues=list(queues), stop_when_empty=True, sleep=0, **options),
                    log=lambda line, state: states.append(state))
    assert worker.run() == 0
    return [s for s in states if s != "RUNNING"]


def make_due() -> None:
    """Make delayed/backed-off rows due now (instead of waiting for them)."""
    QueuedJob.objects.update(available_at=timezone.now() - datetime.timedelta(seconds=1))
