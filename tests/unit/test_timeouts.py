"""The hard limits a process registers (django_jobguard/worker/timeouts.py): the watchdog is armed
for the earliest of every job running, whether in the main thread or async on the worker's
loop (issue 27 item 2)."""

from __future__ import annotations

import asyncio

import pytest

from django_jobguard import aio
from django_jobguard.context import JobContext
from django_jobguard.worker import timeouts, watchdog


class FakeDog:
    """Records what the watchdog would be armed for."""

    def __init__(self) -> None:
        self.armed: str | None = None
        self.seconds = 0.0

    def arm(self, seconds: float, label: str) -> None:
        self.armed, self.seconds = label, seconds

    def disarm(self) -> None:
        self.armed = None


@pytest.fixture
def dog(monkeypatch):
    fake = FakeDog()
    monkeypatch.setattr(watchdog, "for_this_process", lambda: fake)
    monkeypatch.setattr(timeouts, "_armed", None)
    return fake


def test_the_watchdog_is_armed_for_the_earliest_hard_limit_of_the_jobs_running(dog):
    with timeouts.watched(30, "long"):
        assert dog.armed == "long" and dog.seconds == pytest.approx(timeouts.hard_limit(30),
                                                                     abs=1)
        with timeouts.watched(2, "short"):  # an async job starting beside it
            assert dog.armed == "short"
        assert dog.armed == "long"  # the short one ended: the long one is watched again
        with timeouts.watched(0, "untimed"):  # no timeout, no hard limit
            assert dog.armed == "long"
    assert dog.armed is None


def test_an_async_run_of_a_worker_arms_the_hard_limit_and_drain_does_not(dog):
    seen: list[str | None] = []

    async def job() -> str:
        seen.append(dog.armed)
        return "done"

    def run(hard_limit: bool) -> str:
        context = JobContext(job_id="1")
        return asyncio.run(aio.run_job(context, job(), timeout=3, label="tests.Async [1]",
                                       hard_limit=hard_limit))

    assert run(True) == "done" and run(False) == "done"
    assert seen == ["tests.Async [1]", None]
    assert dog.armed is None
