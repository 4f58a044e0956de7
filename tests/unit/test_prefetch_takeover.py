"""Rows of the prefetch buffer that start together (their attempts counted in one statement,
``queue.start_many``) are run only if the worker still holds them: one whose lease ran out
while the worker stalled, and that another worker claimed, is LOST here and not run (as a
single row's owner-checked start refuses it)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from demo.models import JobRun
from django.utils import timezone

from django_jobguard import clock, queue
from django_jobguard.models import QueuedJob
from django_jobguard.worker.loop import Worker, WorkerOptions
from tests.support import POSTGRES, async_jobs, jobs
from tests.support.store_faults import terminate_backend
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("loop_connections")]


def _take_over(row_id) -> None:
    """Another worker claims the row once its lease ran out (this one stalled)."""
    QueuedJob.objects.filter(id=row_id).update(
        available_at=timezone.now() - timedelta(seconds=1))
    taken = queue.claim(["default"], worker_id="other-worker", limit=1, start=1)
    assert [row.id for row in taken] == [row_id]


@pytest.mark.parametrize("kind", ["async", "threads"])
def test_a_buffered_row_another_worker_took_is_lost_here_not_run(kind):
    job_class = async_jobs.AsyncRecord if kind == "async" else jobs.Record
    for i in range(3):
        job_class("lease", key=f"k{i}").dispatch()
    options = (WorkerOptions(queues=["default"], async_concurrency=4) if kind == "async"
               else WorkerOptions(queues=["default"], threads=4))
    worker = Worker(options)
    if kind == "threads":
        worker._executor = worker._threads(4)  # as run() makes it
    rows = queue.claim(["default"], worker_id=worker.id, limit=3, start=0, ahead=3)
    assert len(rows) == 3 and all(queue.claimed_ahead(row) for row in rows)
    taken = rows[1]
    _take_over(taken.id)  # held by other-worker now
    worker._prefetch.put(rows)
    worker._start_from_buffer()
    if kind == "async":
        assert worker._async.wait(timeout=20)
    else:
        wait_for(lambda: worker._executor.busy == 0 and worker.jobs_processed == 3,
                 timeout=20, what="the threads idle")
    ran = set(JobRun.objects.filter(label="lease").values_list("job_id", flat=True))
    assert ran == {str(row.id) for row in rows} - {str(taken.id)}  # not the one w2 holds
    assert QueuedJob.objects.get(id=taken.id).reserved_by == "other-worker"
    assert QueuedJob.objects.get(id=taken.id).attempts == 1  # its claim's, not ours
    assert worker.jobs_processed == 3  # one LOST, two DONE
    worker._executor.shutdown()


@pytest.mark.skipif(not POSTGRES, reason="batched completion is PostgreSQL's")
def test_with_batched_completion_a_row_held_through_a_stall_is_not_run_when_taken_over():
    """A deferred start has no statement to find that another worker took the row: a row
    held past half its lease has its start written, owner-checked, and is LOST here."""
    from django_jobguard.worker.completer import Completer
    from django_jobguard.worker.pipeline import Pipeline

    jobs.Record("lease", key="stalled").dispatch()
    (row,) = queue.claim(["default"], worker_id="w1", limit=1, start=0)
    assert queue.claimed_ahead(row) and row.recovered is False
    row.held_until = clock.lease_clock() + 1  # claimed long ago: this worker stalled since
    _take_over(row.id)
    group = Completer(worker_id="w1", using="default", window=60.0, batch_size=100)
    group.ran(jobs.Record.name, 0.001)  # a fast class: its starts are deferred
    pipeline = Pipeline(worker_id="w1")
    pipeline.completer = group
    try:
        assert pipeline.process(row) == "LOST"
    finally:
        group.close()
    assert not JobRun.objects.exists()
    assert QueuedJob.objects.get(id=row.id).reserved_by == "other-worker"


@pytest.mark.skipif(not POSTGRES, reason="terminates the connection's backend")
def test_after_a_cut_connection_the_rows_started_together_run_now():
    """A database restart cuts the coordinator's connection as it starts buffered rows at
    once: each starts on its own then, on a new connection, and runs now (not left for its
    lease to run out)."""
    from django.db import connection

    for i in range(3):
        async_jobs.AsyncRecord("cut", key=f"k{i}").dispatch()
    worker = Worker(WorkerOptions(queues=["default"], async_concurrency=4))
    rows = queue.claim(["default"], worker_id=worker.id, limit=3, start=0, ahead=3)
    terminate_backend(connection)  # what a restart does to it
    worker._prefetch.put(rows)
    worker._start_from_buffer()
    assert worker._async.wait(timeout=20)
    assert JobRun.objects.filter(label="cut").count() == 3  # all ran now
    assert not QueuedJob.objects.exists()


def test_a_solo_worker_claims_async_rows_by_their_duration():
    """The solo worker's claim grows with a backlog, but async rows wait in the prefetch
    buffer: it takes about AHEAD_SECONDS of their work (their durations are the buffer's),
    so slow async jobs are not hoarded by one worker while others idle, and fast ones are
    still claimed by the batch."""
    from django_jobguard import dispatch_many

    dispatch_many([async_jobs.AsyncRecord("many", key=str(i)) for i in range(600)])
    worker = Worker(WorkerOptions(queues=["default"], async_concurrency=2))
    worker._claim_size._next = worker._claim_size.most  # grown by a backlog
    worker._prefetch.finished(0.02)  # 20 ms jobs: 2 slots x 50 ms of work = 5 rows ahead
    slow = worker._claim()
    assert 1 <= len(slow) <= 2 + 5
    worker._give_back(slow)
    fast = Worker(WorkerOptions(queues=["default"], async_concurrency=2))
    fast._claim_size._next = fast._claim_size.most
    fast._prefetch.finished(0.00001)  # no-op jobs: the whole batch
    assert len(fast._claim()) == fast._claim_size.most
