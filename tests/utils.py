"""Helpers shared by the test modules: run an in-process worker, make rows due, wait."""

from __future__ import annotations

import datetime
import time

from django.utils import timezone

from django_jobguard.models import QueuedJob
from django_jobguard.worker import Worker, WorkerOptions


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


def wait_for(predicate, timeout: float = 30, interval: float = 0.05):
    """Poll until ``predicate()`` is truthy (an event we wait for, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")
