"""Async jobs with a real ``jobworker`` (issue 13): many await at once on one process's event
loop beside sync jobs of the same queue; a WithoutOverlapping lock whose ttl is shorter than
the job is renewed while it awaits; a timeout or an operator's cancel ends only its own task;
a job that blocks the loop is logged by name."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import operations
from django_jobguard.models import FailedJob, QueuedJob
from tests.support import async_jobs, async_long_jobs, jobs, ran_at_once, wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_async_jobs_await_at_once_beside_sync_jobs_of_the_same_queue(workers):
    for i in range(8):
        async_jobs.AsyncRecord(f"async-{i}", seconds=1.5).dispatch()
    for i in range(2):
        jobs.Record(f"sync-{i}").dispatch()
    async_jobs.AsyncWrapped("wrapped", seconds=0.1).dispatch()
    output = "".join(workers(1, "--async-concurrency", "8", "--sleep", "0.1",
                             "--stop-when-empty", "--max-time", "120").wait(120))
    runs = list(JobRun.objects.filter(label__startswith="async-"))
    assert len(runs) == 8 and all(r.ended_at is not None for r in runs)
    assert len({r.pid for r in runs}) == 1
    # One process, several awaiting at once (each awaits 1.5 s).
    assert ran_at_once(runs) >= 4, output
    assert JobRun.objects.filter(label__startswith="sync-").count() == 2
    # A sync-only middleware ran off the loop (sync ORM) around the awaited handle().
    wrapped = {r.label: r for r in JobRun.objects.filter(label__startswith="wrapped")}
    assert set(wrapped) == {"wrapped:before", "wrapped", "wrapped:after:wrapped"}
    assert wrapped["wrapped:before"].started_at <= wrapped["wrapped"].started_at
    assert wrapped["wrapped"].ended_at <= wrapped["wrapped:after:wrapped"].started_at
    assert output.count(" DONE") == 11
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_an_overlap_lock_shorter_than_the_job_is_renewed_while_it_awaits(workers, tmp_path):
    # ttl 1 s, each job awaits 3 s: without renewal the lock would expire under the first and
    # let the second in after 1 s. The one that runs first also waits at a gate until the
    # other was refused five times (claimed six), so the refusals counted below happened
    # however slow the worker (3 s of awaiting alone was a hope for five).
    gate = tmp_path / "gate"
    handles = [async_long_jobs.AsyncRenewed(label, seconds=3, gate=str(gate)).dispatch()
               for label in ("first", "second")]
    pool = workers(1, "--async-concurrency", "4", "--sleep", "0.05", "--max-time", "120",
                   env=worker_env(JOBGUARD_EXTRA_JOB_MODULES="tests.support.async_long_jobs"))
    wait_for(lambda: QueuedJob.objects.filter(id__in=[h.id for h in handles], claims__gte=6)
             .exists(), timeout=60, what="one job refused five times")
    gate.touch()
    wait_for(lambda: JobRun.objects.filter(key="renewed", ended_at__isnull=False).count() == 2,
             timeout=90, what="both jobs to run")
    pool.procs[0].terminate()  # SIGTERM: a graceful stop
    output = "".join(pool.wait(60))
    first, second = sorted(JobRun.objects.filter(key="renewed"), key=lambda r: r.started_at)
    assert first.ended_at <= second.started_at, output  # never both at once
    assert second.token > first.token  # fencing tokens move on
    # The second was refused again and again while the first awaited, well past the 1 s ttl.
    assert output.count("(overlap, retry in") >= 5, output
    assert "lost its overlap lock" not in output


def test_a_timeout_or_a_cancel_ends_only_its_own_task(workers):
    timed_out = async_jobs.AsyncSlowOnce(30, label="slow").dispatch()  # timeout 1 s, 1 try
    cancelled = async_jobs.AsyncRecord("cancel-me", seconds=60).dispatch()
    neighbour = async_jobs.AsyncRecord("neighbour", seconds=2).dispatch()
    pool = workers(1, "--async-concurrency", "4", "--sleep", "0.1", "--stop-when-empty",
                   "--max-time", "120")
    wait_for(lambda: JobRun.objects.filter(label="cancel-me").exists(), timeout=60,
             what="the job to cancel running")
    assert operations.cancel_job(cancelled.id) == operations.STOPPING
    output = "".join(pool.wait(120))
    failed = FailedJob.objects.get()
    assert str(failed.id) == timed_out.id and failed.exception_class.endswith("JobTimeoutError")
    assert JobRun.objects.get(label="slow").key == "cancelled"  # it saw CancelledError
    assert JobRun.objects.get(label="cancel-me").ended_at is None  # stopped at its await
    assert JobRun.objects.get(label="neighbour").ended_at is not None
    assert f"[{cancelled.id}]" in output and "CANCELLED" in output
    assert f"[{neighbour.id}]" in output
    assert not QueuedJob.objects.exists()


def test_a_job_that_blocks_the_loop_is_logged_by_name(workers):
    blocker = async_jobs.AsyncBlocker(2.5).dispatch()
    output = "".join(workers(1, "--sleep", "0.1", "--stop-when-empty",
                             "--max-time", "60").wait(60))
    assert "event loop has not answered" in output, output
    assert f"tests.support.async_jobs.AsyncBlocker [{blocker.id}] is blocking it" in output
    assert "answers again" in output
    assert not QueuedJob.objects.exists()


def test_threads_and_async_share_one_worker_and_one_queue(workers):
    for i in range(6):
        async_jobs.AsyncRecord(f"async-{i}", seconds=1.5).dispatch()
    for i in range(4):
        jobs.Record(f"sync-{i}", seconds=0.5).dispatch()
    output = "".join(workers(1, "--threads", "2", "--async-concurrency", "6", "--sleep", "0.1",
                             "--stop-when-empty", "--max-time", "120").wait(120))
    async_runs = list(JobRun.objects.filter(label__startswith="async-"))
    sync_runs = list(JobRun.objects.filter(label__startswith="sync-"))
    assert len(async_runs) == 6 and len(sync_runs) == 4, output
    assert all(r.ended_at is not None for r in async_runs + sync_runs)
    assert ran_at_once(async_runs) >= 4, output  # awaiting at once, beside the threads
    assert ran_at_once(sync_runs) <= 2  # at most --threads sync jobs at once
    assert output.count(" DONE") == 10
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_a_sync_job_does_not_stop_async_jobs_of_its_queue_from_running_at_once(workers):
    """Without --threads, a sync job used to run in the worker's main thread, which then
    claimed nothing: on a queue holding both kinds the async jobs ran one at a time (issue 27
    item 4). Now the sync jobs run on a thread beside the event loop."""
    for i in range(6):  # interleaved: every async job is queued right behind a sync one
        async_jobs.AsyncRecord(f"async-{i}", seconds=1.0).dispatch()
        jobs.Record(f"sync-{i}", seconds=1.5).dispatch()
    output = "".join(workers(1, "--async-concurrency", "6", "--sleep", "0.1",
                             "--stop-when-empty", "--max-time", "120").wait(120))
    async_runs = list(JobRun.objects.filter(label__startswith="async-"))
    sync_runs = list(JobRun.objects.filter(label__startswith="sync-"))
    assert len(async_runs) == 6 and len(sync_runs) == 6, output
    assert all(r.ended_at is not None for r in async_runs + sync_runs)
    assert len({r.pid for r in async_runs + sync_runs}) == 1
    # While some sync job ran, several async jobs ran at once.
    during = max(ran_at_once([_Clipped(r, s) for r in async_runs
                                if r.started_at < s.ended_at and r.ended_at > s.started_at])
                 for s in sync_runs)
    assert during > 1, output
    assert ran_at_once(sync_runs) == 1  # one sync job at a time, as without async ones
    assert output.count(" DONE") == 12
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


class _Clipped:
    """A run's interval cut to another's."""

    def __init__(self, run, within) -> None:
        self.started_at = max(run.started_at, within.started_at)
        self.ended_at = min(run.ended_at, within.ended_at)
