"""In-process helpers: run a worker in this process, make rows due, expire a lock, wait."""

from __future__ import annotations

import datetime

from django.db.models.functions import Now
from django.utils import timezone

from django_jobguard.models import Lock, QueuedJob
from django_jobguard.stores import Store
from django_jobguard.stores.database import DatabaseStore
from django_jobguard.worker import Worker, WorkerOptions
from tests.support.waiting import wait_for


def work(queues=("default",), **options) -> list[str]:
    """Run a worker until the queue is empty; returns the states it logged."""
    states: list[str] = []
    # memory=0: the 128 MB limit is for worker processes, not for pytest running every module.
    options = {"memory": 0, **options}
    worker = Worker(WorkerOptions(queues=list(queues), stop_when_empty=True, sleep=0, **options),
                    log=lambda line, state: states.append(state))
    assert worker.run() == 0
    return [s for s in states if s != "RUNNING"]


def make_due() -> None:
    """Make delayed/backed-off rows due now (instead of waiting for them)."""
    QueuedJob.objects.update(available_at=timezone.now() - datetime.timedelta(seconds=1))


def expire(store: Store, key: str) -> None:
    """Make a held lock expire now, on the store's own terms (no waiting out its ttl)."""
    if isinstance(store, DatabaseStore):
        Lock.objects.using(store.using).filter(key=key).update(
            expires_at=Now() - datetime.timedelta(seconds=1))
    else:
        store.client.pexpire(key, 1)
        wait_for(lambda: not store.client.exists(key), timeout=5, interval=0.002)
    assert store.get_lock(key) is None
