"""``--threads`` in-process: the coordinator's stop conditions, the memory limit and the time
limits of jobs in threads (real threads, each with its own database connection)."""

from __future__ import annotations

import threading

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.worker import Worker, WorkerOptions, timeouts
from django_jobguard.worker import loop as worker
from django_jobguard.worker.executor import EXIT_STUCK
from tests.support import jobs, wait_for
from tests.support.thread_jobs import SleepInC, Spin

pytestmark = pytest.mark.django_db(transaction=True)


def run(**options) -> tuple[int, Worker]:
    options.setdefault("memory", 0)  # the test process itself may be over 128 MB
    w = Worker(WorkerOptions(sleep=0.05, **options))
    return w.run(), w


def test_threads_run_every_job_once_and_stop_when_empty():
    dispatch_many([jobs.Record("t", key=str(i), seconds=0.05) for i in range(12)])
    code, w = run(threads=4, stop_when_empty=True)
    assert code == 0 and w.jobs_processed == 12
    assert JobRun.objects.values("job_id").distinct().count() == 12
    assert len({run.pid for run in JobRun.objects.all()}) == 1
    assert not QueuedJob.objects.exists() and not WorkerRow.objects.exists()


def test_max_jobs_counts_the_jobs_running_and_once_runs_one():
    dispatch_many([jobs.Record("t", key=str(i)) for i in range(10)])
    code, w = run(threads=4, max_jobs=5)
    assert code == 0 and JobRun.objects.count() == 5 and QueuedJob.objects.count() == 5
    code, w = run(threads=4, once=True)
    assert code == 0 and JobRun.objects.count() == 6


def test_over_the_memory_limit_the_running_jobs_finish_then_exit_12(monkeypatch):
    monkeypatch.setattr(worker, "_rss_mb", lambda: 10_000.0)
    dispatch_many([jobs.Record("t", key=str(i), seconds=0.2) for i in range(6)])
    code, w = run(threads=3, memory=128)
    assert code == worker.EXIT_MEMORY
    assert JobRun.objects.filter(ended_at__isnull=False).count() == 3  # those it had started
    assert QueuedJob.objects.count() == 3
    assert not QueuedJob.objects.filter(reserved_at__isnull=False).exists()


def test_a_timeout_is_raised_in_a_job_running_python_code_in_its_thread():
    Spin("spin").dispatch()
    code, w = run(threads=2, stop_when_empty=True)
    assert code == 0
    failed = FailedJob.objects.get()
    assert failed.exception_class.endswith("ThreadTimeoutError")
    assert "timed out after 1 s" in failed.message


def test_a_worker_whose_threads_are_all_stuck_exits_13(monkeypatch):
    monkeypatch.setattr(timeouts, "GRACE", 0.5)
    dispatch_many([SleepInC(f"s{i}", seconds=3) for i in range(2)])
    code, w = run(threads=2)
    assert code == EXIT_STUCK
    rows = list(QueuedJob.objects.values("reserved_at", "attempts", "exceptions", "last_error"))
    assert len(rows) == 2
    assert all(r["reserved_at"] is None and r["attempts"] == 1 and r["exceptions"] == 1
               and "given up" in r["last_error"] for r in rows)
    # the stuck threads end when their sleep returns (their late writes change nothing)
    wait_for(lambda: not [t for t in threading.enumerate()
                          if t.name.startswith("jobguard-executor")], timeout=15,
             what="the stuck threads ended")
    assert QueuedJob.objects.filter(reserved_at__isnull=True).count() == 2


def test_writes_of_an_attempt_that_was_ended_do_not_touch_a_later_claim_by_the_same_worker():
    """What a given-up thread may still do when its call returns: every write is checked
    against the claim it came from, not only the worker."""
    from django_jobguard import queue

    jobs.Record("again").dispatch()
    (stale,) = queue.claim(["default"], worker_id="w", limit=1)
    assert queue.release(stale)  # the coordinator ended that attempt
    (current,) = queue.claim(["default"], worker_id="w", limit=1)  # the same worker again
    assert current.claims == stale.claims + 1
    assert not queue.ack(stale)
    assert not queue.release(stale)
    assert queue.fail(stale, RuntimeError("late")) is None
    row = QueuedJob.objects.get()
    assert row.reserved_by == "w" and row.claims == current.claims
    assert queue.ack(current) and not QueuedJob.objects.exists()



@pytest.mark.django_db
def test_without_threads_the_loop_runs_each_job_on_the_solo_executor_in_its_own_thread(
        monkeypatch):
    """One loop for every executor: without ``--threads`` it is a one-slot executor that runs
    each job in the loop's thread (where SIGALRM reaches it), the job's lease and that of the
    row claimed ahead (``then``, started by its ack) renewed while it runs."""
    from django_jobguard.worker.executor import SoloExecutor

    handles = [jobs.Noop(n).dispatch() for n in range(4)]
    w = Worker(WorkerOptions(queues=["default"], stop_when_empty=True, sleep=0, memory=0))
    assert isinstance(w._executor, SoloExecutor) and w._executor.free() == 1
    seen = []
    real = w.process

    def process(row, *, then=None):
        held = w.held_ids()
        seen.append((row.id, threading.current_thread(), row.id in held,
                     then is None or then.id in held))
        return real(row, then=then)

    monkeypatch.setattr(w, "process", process)
    assert w.run() == 0
    assert [str(row_id) for row_id, *_ in seen] == [str(handle.id) for handle in handles]
    assert {thread for _, thread, _, _ in seen} == {threading.current_thread()}
    assert all(running and ahead for _, _, running, ahead in seen)
    assert not QueuedJob.objects.exists()
