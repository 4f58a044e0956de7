"""Pausing a queue with real ``jobworker`` processes: claims skip it at once, a running job
finishes, an unstarted batch is given back, and a resume is served (at once on PostgreSQL,
where the resume's NOTIFY wakes idle workers)."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import dispatch, dispatch_many, operations
from django_jobguard.models import QueuedJob
from tests.support import POSTGRES, jobs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# On PostgreSQL the workers sleep far longer than the test waits: only the NOTIFY of the
# resume can wake them in time. Elsewhere they poll.
SLEEP = "60" if POSTGRES else "0.2"


def test_workers_skip_a_paused_queue_and_serve_it_after_resume(workers):
    operations.pause("paused", force=True)
    workers(2, "--queue", "paused,other", "--sleep", SLEEP, "--max-time", "120")
    wait_for(lambda: operations.stats()["workers"] == 2, what="2 workers registered")
    dispatch_many([jobs.Record("p", key=str(n)) for n in range(4)], queue="paused")
    dispatch_many([jobs.Record("o", key=str(n)) for n in range(4)], queue="other")
    # Each claim asks for "paused" first: "other" ran, so every claim skipped "paused".
    wait_for(lambda: JobRun.objects.filter(label="o").count() == 4, what="'other' jobs ran")
    assert not JobRun.objects.filter(label="p").exists()
    assert QueuedJob.objects.filter(queue="paused", attempts=0).count() == 4
    operations.resume("paused")
    wait_for(lambda: JobRun.objects.filter(label="p").count() == 4, timeout=20,
             what="the resumed queue's jobs ran")
    assert sorted(JobRun.objects.filter(label="p").values_list("key", flat=True)) == [
        "0", "1", "2", "3"]


def test_a_running_job_finishes_and_the_next_one_waits(workers, tmp_path):
    # The long job waits at a gate opened once the queue is paused: it is still running then
    # however slow the test process is (1.5 s of sleep was a hope).
    gate = tmp_path / "gate"
    dispatch(jobs.Record("long", seconds=0.2, gate=str(gate)), queue="work")
    dispatch(jobs.Record("next"), queue="work")
    pool = workers(1, "--queue", "work", "--sleep", "0.2", "--stop-when-empty",
                   "--max-time", "120")
    wait_for(lambda: JobRun.objects.filter(label="long").exists(), what="the long job started")
    operations.pause("work")
    gate.touch()
    pool.wait(60)  # its next claim finds the paused queue empty: --stop-when-empty exits
    long_run = JobRun.objects.get(label="long")
    assert long_run.ended_at is not None  # it finished, it was not cut off
    assert not JobRun.objects.filter(label="next").exists()
    left = QueuedJob.objects.get(queue="work")
    assert (left.attempts, left.reserved_by) == (0, "")


def test_an_unstarted_batch_is_given_back_when_its_queue_is_paused(workers, tmp_path):
    # The first of the batch waits at a gate opened once the queue is paused, so the second
    # has not started then however slow the test process is (1.5 s each, and no gate, was a
    # hope); its 1.5 s after the gate let the worker look at the pause (once a second).
    gate = tmp_path / "gate"
    dispatch_many([jobs.Record("batch", key=str(n), seconds=1.5, gate=str(gate))
                   for n in range(3)], queue="batched")
    pool = workers(1, "--queue", "batched", "--batch", "3", "--sleep", "0.2",
                   "--stop-when-empty", "--max-time", "120")
    wait_for(lambda: JobRun.objects.filter(label="batch").exists(), what="the batch started")
    operations.pause("batched")
    gate.touch()
    pool.wait(60)
    assert JobRun.objects.filter(label="batch").count() == 1
    assert JobRun.objects.get(label="batch").ended_at is not None
    rows = QueuedJob.objects.filter(queue="batched")
    assert sorted((row.attempts, row.reserved_by) for row in rows) == [(0, ""), (0, "")]
