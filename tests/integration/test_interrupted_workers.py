"""Interrupted is not failed, with real worker processes (docs/long-jobs.md#interrupted-is-
not-failed): a graceful stop (SIGTERM, --max-time) gives a running job back to the queue with
its attempt unused, cooperatively (``job.stopping`` / ``job.interrupt()``) or at
``--stop-timeout``; a hard kill (SIGKILL) spends the attempt."""

from __future__ import annotations

import signal

import pytest
from demo.models import JobRun

from django_jobguard.models import FailedJob, QueuedJob
from tests.support import start_workers, wait_for
from tests.support.long_jobs import AsyncLongLoop, LongLoop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def started(key: str) -> JobRun:
    return wait_for(lambda: JobRun.objects.filter(key=key).first(), timeout=60,
                    what=f"job {key} to start")


def back_in_queue(job_id: str) -> QueuedJob:
    row = QueuedJob.objects.get(id=job_id)
    assert row.reserved_at is None and row.reserved_by == ""  # waiting, no worker holds it
    return row


def test_sigterm_hands_a_cooperative_job_back_with_its_attempt_unused():
    handle = LongLoop("coop").dispatch()
    pool = start_workers(1, "--sleep", "0.1")
    started("coop")
    pool.procs[0].send_signal(signal.SIGTERM)
    out = pool.wait(timeout=60)[0]
    row = back_in_queue(handle.id)
    assert row.attempts == 0 and row.exceptions == 0 and row.last_error == ""
    assert list(JobRun.objects.values_list("label", "attempt")) == [("interrupted", 1)]
    assert "RELEASED" in out and "interrupted" in out
    assert not FailedJob.objects.exists()


def test_max_time_reached_inside_a_job_makes_it_stop_and_go_back():
    handle = LongLoop("max-time").dispatch()
    pool = start_workers(1, "--sleep", "0.1", "--max-time", "2")
    pool.wait(timeout=60)
    assert back_in_queue(handle.id).attempts == 0
    assert list(JobRun.objects.values_list("label", flat=True)) == ["interrupted"]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_stop_timeout_interrupts_a_job_that_does_not_look_and_restores_its_attempt(threads):
    handle = LongLoop("stubborn", cooperative=False).dispatch()
    pool = start_workers(1, "--sleep", "0.1", "--stop-timeout", "1", "--threads", threads)
    started("stubborn")
    pool.procs[0].send_signal(signal.SIGTERM)
    out = pool.wait(timeout=60)[0]
    row = back_in_queue(handle.id)
    assert row.attempts == 0 and row.exceptions == 0
    assert "stop_timeout" in out or "stop-timeout" in out
    # It runs again from the start, as attempt 1 again, and can finish.
    QueuedJob.objects.filter(id=handle.id).update(payload={
        **row.payload, "kwargs": {**row.payload["kwargs"], "steps": 1}})
    start_workers(1, "--sleep", "0.1", "--stop-when-empty").wait(timeout=60)
    assert list(JobRun.objects.order_by("id").values_list("attempt", flat=True)) == [1, 1]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_stop_timeout_interrupts_an_async_job():
    handle = AsyncLongLoop("async-stubborn").dispatch()
    pool = start_workers(1, "--sleep", "0.1", "--stop-timeout", "1")
    started("async-stubborn")
    pool.procs[0].send_signal(signal.SIGTERM)
    pool.wait(timeout=60)
    assert back_in_queue(handle.id).attempts == 0


def test_a_hard_kill_spends_the_attempt():
    handle = LongLoop("killed").dispatch()
    pool = start_workers(1, "--sleep", "0.1")
    started("killed")
    pool.kill()  # SIGKILL: nothing can give the job back; its lease runs out
    row = QueuedJob.objects.get(id=handle.id)
    assert row.attempts == 1 and row.reserved_at is not None
