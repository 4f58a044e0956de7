"""``jobworker --threads``: real worker processes running many jobs at once, on SQLite and on
PostgreSQL (+ Redis as the lock store where configured)."""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from tests.support import jobs, ran_at_once, wait_for, worker_env
from tests.support.lock_jobs import Overlap
from tests.support.thread_jobs import SleepInC, Spin

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LOCKED = "database is locked"


def assert_no_overlap(runs: list[dict]) -> None:
    """No two runs of one key overlap in time."""
    by_key = defaultdict(list)
    for run in runs:
        by_key[run["key"]].append(run)
    for key, key_runs in by_key.items():
        key_runs.sort(key=lambda r: r["started_at"])
        for before, after in zip(key_runs, key_runs[1:], strict=False):
            assert after["started_at"] >= before["ended_at"], (key, before, after)


@pytest.mark.parametrize("processes,threads", [(1, 20), (2, 10)])
def test_without_overlapping_jobs_on_three_keys_never_overlap_per_key(
        store_alias, workers, processes, threads):
    keys = ["a", "b", "c"]
    pool = workers(processes, "--threads", str(threads), "--sleep", "0.1")
    wait_for(lambda: WorkerRow.objects.count() == processes, timeout=60, what="workers up")
    dispatch_many([Overlap(keys[i % 3], label="threads", seconds=0.05, release_after=0.05)
                   for i in range(20)])
    wait_for(lambda: JobRun.objects.filter(label="threads", ended_at__isnull=False).count() >= 20,
             timeout=120, what="all 20 jobs ran")
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    outputs = pool.wait(60)
    runs = list(JobRun.objects.filter(label="threads").values("key", "job_id", "started_at",
                                                               "ended_at", "pid"))
    assert len(runs) == 20 and len({r["job_id"] for r in runs}) == 20  # each ran once
    assert_no_overlap(runs)
    assert ran_at_once(runs) >= 2  # the keys really ran side by side
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert not any(LOCKED in out for out in outputs)


def test_sigterm_with_twenty_jobs_in_flight_finishes_them_and_takes_no_more(workers, tmp_path):
    # The twenty wait at a gate opened once the SIGTERM was sent: all are in flight then,
    # however slow the test process or the worker (1.5 s each was a hope).
    gate = tmp_path / "gate"
    dispatch_many([jobs.Record("flight", key=str(i), seconds=0.2, gate=str(gate))
                   for i in range(20)])
    pool = workers(1, "--threads", "20", "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(label="flight").count() == 20, timeout=60,
             what="20 jobs running")
    dispatch_many([jobs.Record("later", key=str(i)) for i in range(5)])
    pool.procs[0].send_signal(signal.SIGTERM)
    gate.touch()
    out = pool.wait(60)[0]
    assert JobRun.objects.filter(label="flight", ended_at__isnull=False).count() == 20
    assert not JobRun.objects.filter(label="later").exists()
    assert QueuedJob.objects.count() == 5  # the five later ones wait, untouched
    assert not QueuedJob.objects.filter(reserved_at__isnull=False).exists()
    assert set(QueuedJob.objects.values_list("attempts", flat=True)) == {0}
    assert not WorkerRow.objects.exists()
    assert LOCKED not in out


def test_a_second_ctrl_c_hands_every_running_job_back(workers):
    dispatch_many([jobs.Record("back", key=str(i), seconds=60) for i in range(20)])
    pool = workers(1, "--threads", "20", "--sleep", "0.1", "--timeout", "0")
    wait_for(lambda: JobRun.objects.filter(label="back").count() == 20,
             timeout=60, what="20 jobs running")
    proc = pool.procs[0]
    proc.send_signal(signal.SIGINT)
    first = ""
    while "got SIGINT" not in first:  # two signals sent at once would arrive as one
        first = proc.stdout.readline()
        assert first, "the worker exited after one Ctrl-C"
    proc.send_signal(signal.SIGINT)
    out = pool.wait(60)[0]
    rows = list(QueuedJob.objects.values("reserved_at", "attempts"))
    assert len(rows) == 20  # none lost
    assert all(r["reserved_at"] is None and r["attempts"] == 0 for r in rows), out[-2000:]
    assert not FailedJob.objects.exists()


def test_a_stuck_thread_is_given_up_its_attempt_ends_and_the_worker_goes_on(workers):
    SleepInC("stuck", seconds=20).dispatch()
    Spin("spin").dispatch()
    pool = workers(1, "--threads", "2", "--sleep", "0.1")
    # the job sleeping in C cannot be interrupted: given up after timeout + grace
    wait_for(lambda: QueuedJob.objects.filter(last_error__contains="JobTimeoutError",
                                              reserved_at__isnull=True).exists(),
             timeout=60, what="the stuck job's attempt ended")
    row = QueuedJob.objects.get()
    assert row.attempts == 1 and row.exceptions == 1  # retried later per its policy (tries=2)
    # the spinning job was interrupted in its own thread (tries=1: failed)
    wait_for(lambda: FailedJob.objects.filter(exception_class__endswith="TimeoutError").exists(),
             timeout=30, what="the spinning job failed")
    # and the worker still runs jobs on its remaining and replaced threads
    dispatch_many([jobs.Record("after", key=str(i)) for i in range(3)])
    wait_for(lambda: JobRun.objects.filter(label="after").count() == 3, timeout=30,
             what="jobs after the stuck one")
    pool.procs[0].send_signal(signal.SIGTERM)
    out = pool.wait(60)[0]
    assert "is replaced" in out or "replaced" in out


def test_a_worker_whose_threads_are_all_stuck_exits_non_zero(workers):
    dispatch_many([SleepInC(f"stuck-{i}", seconds=60) for i in range(2)])
    pool = workers(1, "--threads", "2", "--sleep", "0.1")
    proc = pool.procs[0]
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 13, out[-3000:]
    rows = list(QueuedJob.objects.values("reserved_at", "attempts", "last_error"))
    assert len(rows) == 2
    assert all(r["reserved_at"] is None and "JobTimeoutError" in r["last_error"] for r in rows)


def test_global_concurrency_holds_across_three_worker_processes(workers):
    env = worker_env(JOBGUARD_QUEUES=json.dumps({"reports": {"global_concurrency": 2}}))
    pool = workers(3, "--threads", "3", "--queue", "reports", "--sleep", "0.1", env=env)
    wait_for(lambda: WorkerRow.objects.count() == 3, timeout=60, what="workers up")
    dispatch_many([jobs.Record("capped", key=str(i), seconds=0.3) for i in range(12)],
                  queue="reports")
    wait_for(lambda: JobRun.objects.filter(label="capped", ended_at__isnull=False).count() == 12,
             timeout=120, what="all 12 jobs ran")
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    outputs = pool.wait(60)
    runs = list(JobRun.objects.filter(label="capped").values("started_at", "ended_at", "pid"))
    assert len(runs) == 12
    assert ran_at_once(runs) == 2  # never more than the cap, and the cap was used
    assert not QueuedJob.objects.exists()
    assert not any(LOCKED in out for out in outputs)


def test_weighted_queues_share_one_slot_three_to_one(workers):
    dispatch_many([jobs.Record("high", key=str(i)) for i in range(12)], queue="high")
    dispatch_many([jobs.Record("default", key=str(i)) for i in range(12)])
    workers(1, "--queue", "high:3,default:1", "--batch", "1", "--stop-when-empty",
            "--sleep", "0").wait(120)
    order = list(JobRun.objects.order_by("started_at", "id").values_list("label", flat=True))
    assert len(order) == 24
    assert order[:12].count("default") == 3  # while both had work: 3 high per default
    assert order[:8] == ["high", "high", "default", "high"] * 2


def test_processes_of_threads_renew_every_running_jobs_lease_and_show_them_all(
        workers, tmp_path):
    """--concurrency 2 --threads 3 with a 3 s lease and 4 s jobs: without the heartbeat
    renewing every running job's lease they would run twice."""
    # The jobs wait at a gate (then take their 4 s) until a row showed three of them and
    # both processes run some: a stalled process could see them all end first, or the other
    # take all six (4 s each was a hope).
    gate = tmp_path / "gate"
    env = worker_env(JOBGUARD_RETRY_AFTER="3", JOBGUARD_DEFAULT_TIMEOUT="0")
    # --async-concurrency 1: the test jobs include async ones, and a sync row claimed for a
    # free async slot waits for a thread; with one such slot each process claims at most 4.
    pool = workers(1, "--concurrency", "2", "--threads", "3", "--async-concurrency", "1",
                   "--sleep", "0.1", env=env)
    wait_for(lambda: WorkerRow.objects.count() == 2, timeout=60, what="two workers up")
    dispatch_many([jobs.Record("long", key=str(i), seconds=4, gate=str(gate))
                   for i in range(6)])
    shown = wait_for(lambda: [row.current_job.split(",") for row in WorkerRow.objects.all()
                              if row.current_job.count(",") == 2], timeout=60,
                     what="a worker row listing its three running jobs")
    assert set(shown[0]) <= {str(i) for i in QueuedJob.objects.values_list("id", flat=True)}
    wait_for(lambda: len(set(JobRun.objects.filter(label="long").values_list("pid", flat=True)))
             == 2, timeout=60, what="both processes running jobs")
    gate.touch()
    wait_for(lambda: JobRun.objects.filter(label="long", ended_at__isnull=False).count() == 6,
             timeout=120, what="the six jobs ran")
    pool.procs[0].send_signal(signal.SIGTERM)
    pool.wait(60)
    runs = list(JobRun.objects.filter(label="long").values_list("job_id", "pid"))
    assert len(runs) == 6 and len({job_id for job_id, _ in runs}) == 6  # none ran twice
    assert len({pid for _, pid in runs}) == 2  # both processes ran jobs
    assert not QueuedJob.objects.exists()


def test_a_row_waiting_for_a_thread_is_not_followed_by_more_claims(workers, tmp_path):
    """--threads 3 --async-concurrency 1 and six sync jobs of 4 s: the worker holds four rows
    (three running, one claimed for the async slot waiting for a thread) and claims no more
    while that row waits, so another worker can take the other two. (With the prefetch
    buffer it once claimed again for the "free" async slot, one sync row at a time, until it
    held the whole queue.)"""
    # The jobs wait at a gate until the test has watched: none ends meanwhile however slow
    # the machine (4 s each was a hope: a stalled test saw them end and the rows move on).
    gate = tmp_path / "gate"
    env = worker_env(JOBGUARD_DEFAULT_TIMEOUT="0")
    pool = workers(1, "--threads", "3", "--async-concurrency", "1", "--sleep", "0.05",
                   env=env)
    wait_for(lambda: WorkerRow.objects.count() == 1, timeout=60, what="the worker up")
    dispatch_many([jobs.Record("held", key=str(i), gate=str(gate)) for i in range(6)])
    wait_for(lambda: JobRun.objects.filter(label="held").count() == 3, timeout=30,
             what="three jobs running")
    wait_for(lambda: QueuedJob.objects.exclude(reserved_by="").count() >= 4, timeout=30,
             what="a fourth row claimed for the async slot")
    held = [QueuedJob.objects.exclude(reserved_by="").count()]
    for _ in range(20):  # watched for 1 s: twenty of the worker's claim rounds at --sleep 0.05
        time.sleep(0.05)
        held.append(QueuedJob.objects.exclude(reserved_by="").count())
    assert max(held) == 4, held
    pool.procs[0].send_signal(signal.SIGTERM)
    gate.touch()
    pool.wait(60)


def test_a_queues_number_caps_its_running_jobs_in_a_threaded_worker(workers):
    dispatch_many([jobs.Record("slow", key=str(i), seconds=0.3) for i in range(4)],
                  queue="slow")
    dispatch_many([jobs.Record("fast", key=str(i), seconds=0.1) for i in range(12)])
    workers(1, "--threads", "4", "--queue", "slow:1,default:3", "--stop-when-empty",
            "--sleep", "0.1").wait(120)
    slow = list(JobRun.objects.filter(label="slow").values("started_at", "ended_at"))
    fast = list(JobRun.objects.filter(label="fast").values("started_at", "ended_at"))
    assert len(slow) == 4 and len(fast) == 12
    assert ran_at_once(slow) == 1  # slow:1
    assert ran_at_once(fast) <= 3 and ran_at_once(slow + fast) >= 2
