"""Faults other than kill -9 while finished jobs wait for their completion group (issue 29),
for each execution mode: a database restart (``pg_terminate_backend`` of every worker
connection), a Redis restart under unique jobs, and a lease taken over by another worker.

What they may cost (docs/guarantees.md#batched-completion): a group whose write met a cut
connection is not written; its rows run again once their lease ran out, and that re-run uses
no try. A worker never acks in a group a row that another worker took over.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest
from demo.models import JobRun
from django.db import transaction
from django.utils import timezone

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob, Worker
from django_jobguard.stores import get_store
from tests.chaos import jobs as chaos_jobs
from tests.chaos.conftest import LONG_LEASE, Outcome, chaos_env, stopped, terminate_backends
from tests.chaos.test_redis_restart import assert_unique_jobs_outlived_the_restart
from tests.support import POSTGRES, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not POSTGRES, reason="batched completion is PostgreSQL's")]

MODES = pytest.mark.parametrize("mode", [(), ("--threads", "4"), ("--async-concurrency", "4")],
                                ids=["solo", "threads", "async"])
APP = "jobguard-chaos-completion"
GROUP_LOST = "Could not write a completion group"
RELEASE_FAILED = "Could not release unique lock"


def _is_async(mode: tuple[str, ...]) -> bool:
    return "--async-concurrency" in mode


def _unique_jobs(mode: tuple[str, ...], total: int, gate: str = "") -> tuple[list, str]:
    """``total`` unique jobs of the mode's kind (keys 0..total-1), and their runs' label;
    with ``gate``, the second half waits for that file."""
    def held(i: int) -> str:
        return gate if i >= total // 2 else ""

    if _is_async(mode):
        return ([chaos_jobs.AsyncUniqueRecord(str(i), held(i)) for i in range(total)],
                "async-unique")
    return [chaos_jobs.UniqueRecord(str(i), held(i)) for i in range(total)], "unique"


def _unique_jobs_on_two_workers(fleet, mode: tuple[str, ...], total: int, gate: str = "",
                                **env: str):
    """``total`` unique jobs of the mode's kind dispatched (``gate`` as in _unique_jobs), and
    two workers of the mode started on them (long leases, ``env`` added): the handles, the
    runs' label, the fleet and its processes."""
    made, label = _unique_jobs(mode, total, gate)
    handles = dispatch_many(made)
    assert all(handles)
    workers = fleet("--sleep", "0.2", *mode, env=chaos_env(**LONG_LEASE, **env))
    return handles, label, workers, workers.start(2)


@MODES
def test_database_restart_while_groups_wait_loses_nothing_and_a_lost_group_uses_no_try(
        fleet, mode):
    total = 200
    handles, label, workers, procs = _unique_jobs_on_two_workers(
        fleet, mode, total, JOBGUARD_COMPLETION_WINDOW="0.5", PGAPPNAME=APP)
    runs = JobRun.objects.filter(label=label)
    cut = rounds = 0
    for tenth in range(2, 9):  # at 20 %, 30 %, ... of the runs, until a group met a cut
        wait_for(lambda tenth=tenth: runs.count() >= total * tenth // 10, timeout=60)
        if tenth > 3 and GROUP_LOST in workers.errors():
            break
        cut += terminate_backends(APP)
        rounds += 1
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=120, what="the queue drained")
    assert all(p.poll() is None for p in procs), workers.errors()  # no worker died
    assert workers.stop_all() == [0, 0], workers.errors()

    out = Outcome.read((str(h.id) for h in handles), label)
    errors = workers.errors()
    assert cut >= 4 and out.queued == 0 and not out.failed, errors[-3000:]
    assert out.completed == out.ids  # every job ran to its end
    assert GROUP_LOST in errors  # a cut met a group waiting to be written
    for job_id, job_runs in out.runs.items():
        attempts = [r["attempt"] for r in job_runs]
        assert attempts == sorted(attempts), (job_id, job_runs)
    # The rows of a group that was not written ran again without using a try. A try went
    # only where a cut connection failed a job's own query or its per-job ack (the first
    # run of a class, a recovered row): one statement per cut connection at most, except
    # that the async jobs of a worker share one connection for their own ORM calls (its
    # asgiref thread), so each of the 4 running then may meet that cut.
    again = [runs for runs in out.runs.values() if runs[0]["ended_at"] is not None
             and len(runs) > 1 and runs[-1]["attempt"] == runs[0]["attempt"]]
    spent = [runs for runs in out.runs.values() if runs[-1]["attempt"] > 1]
    sharing = 4 if _is_async(mode) else 1
    tries = sum(runs[-1]["attempt"] - 1 for runs in spent)
    assert again and tries <= cut * sharing, (len(again), spent)
    assert all(runs[-1]["attempt"] <= 1 + rounds for runs in spent)  # one try a cut at most
    # A lock stays held only where its release met a cut connection (logged; the next
    # dispatch of the key takes it over, its job being gone): once per cut connection, not
    # every lock of the group whose release came after it on that connection.
    left = get_store().locks()
    assert len(left) == errors.count(RELEASE_FAILED) <= cut, [lock.key for lock in left]
    assert all(dispatch_many(_unique_jobs(mode, total)[0]))  # every key can be dispatched


@pytest.mark.skipif(os.environ.get("JOBGUARD_CHAOS_REDIS_RESTART") != "1",
                    reason="restarts a redis-server: set JOBGUARD_CHAOS_REDIS_RESTART=1")
@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
@MODES
def test_redis_restart_while_groups_wait_loses_nothing_and_leaves_no_stale_lock(
        fleet, private_redis, mode, tmp_path):
    total = 200
    # The second half waits at a gate opened once Redis is down (see restart_midway).
    gate = tmp_path / "gate"
    handles, label, workers, procs = _unique_jobs_on_two_workers(
        fleet, mode, total, str(gate), JOBGUARD_COMPLETION_WINDOW="0.2",
        JOBGUARD_REDIS_URL=private_redis.url, JOBGUARD_STORE="redis")
    # Redis stays down until a group was written without it: its releases failed.
    private_redis.restart_midway(label, total, finished_meanwhile=10,
                                 until=lambda: RELEASE_FAILED in workers.errors(), gate=gate)
    assert_unique_jobs_outlived_the_restart(workers, procs, handles, label)
    assert all(dispatch_many(_unique_jobs(mode, total)[0]))  # no stale lock


@MODES
def test_a_group_never_acks_a_row_another_worker_took_over(fleet, mode, tmp_path):
    """A worker stalled (SIGSTOP) while a finished job waits for its group loses the row to
    another worker; resumed, it writes the group, which must leave the row alone (LOST): it
    is the new owner's, still running there, and acked by it alone."""
    record = chaos_jobs.AsyncRerunWaits if _is_async(mode) else chaos_jobs.RerunWaits
    workers = fleet("--sleep", "0.2", *mode,
                    env=chaos_env(JOBGUARD_COMPLETION_WINDOW="30", JOBGUARD_LOG_LEVEL="INFO",
                                  JOBGUARD_RETRY_AFTER="4"))  # the new owner keeps it
    (first,) = workers.start(1)
    record("warm").dispatch()  # the class's first run here is acked on its own ...
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=60, what="the warm-up ran")
    # ... so these two defer their starts: "target" finishes and waits for the group (30 s)
    # while "long" keeps the worker busy (an idle worker writes its group at once). One
    # commit: a worker that claimed "target" alone could find no "long" yet as it ended.
    # "long" waits at a gate opened once the worker is stopped: it keeps the worker busy
    # until then however slow the test process (4 s alone was a hope).
    gate = tmp_path / "gate"
    with transaction.atomic():
        target = record("target", hold=True).dispatch(priority=5)
        record("long", seconds=4, gate=str(gate)).dispatch(priority=1)
    label = chaos_jobs.RerunWaits.LABEL
    wait_for(lambda: JobRun.objects.filter(label=label, key="target", ended_at__isnull=False)
             .exists() and JobRun.objects.filter(label=label, key="long").exists(),
             timeout=60, what="target finished and long started")
    first.send_signal(signal.SIGSTOP)  # no heartbeat renews its 4 s lease
    try:
        # Its start was deferred (no attempt written), so its ack waits in the group.
        assert QueuedJob.objects.get(id=target.id).attempts == 0
        wait_for(lambda: stopped(first.pid), timeout=10, interval=0.01,
                 what="the first worker stopped")
        gate.touch()
        (second,) = workers.start(1)  # takes both rows once their lease ran out
        wait_for(lambda: JobRun.objects.filter(label=label, key="target", pid=second.pid)
                 .exists(), timeout=60, what="the second worker runs target")
    finally:
        first.send_signal(signal.SIGCONT)
    # Resumed, the first worker's "long" ends, it goes idle and writes its group.
    lost = f"[{target.id}]"
    wait_for(lambda: any(lost in line and "LOST" in line
                         for line in workers.log_of(first).splitlines()),
             timeout=60, what="the first worker's group found target not its own")
    second_id = Worker.objects.get(pid=second.pid).id
    row = QueuedJob.objects.get(id=target.id)  # still there, the second worker's
    assert row.reserved_by == second_id
    JobRun.objects.create(label="go", key=str(target.id), started_at=timezone.now())
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=60, what="the queue drained")
    assert workers.stop_all() == [0, 0], workers.errors()

    first_log, second_log = workers.log_of(first), workers.log_of(second)
    assert not any(lost in line and "DONE" in line for line in first_log.splitlines())
    assert any(lost in line and "DONE" in line for line in second_log.splitlines()), second_log
    assert not any(lost in line and "LOST" in line for line in second_log.splitlines())
    runs = list(JobRun.objects.filter(label=label, key="target").order_by("id"))
    assert [r.pid for r in runs] == [first.pid, second.pid]
    assert all(r.ended_at is not None for r in runs)
    assert [r.attempt for r in runs] == [1, 1]  # its start was never written: no try used
    assert not FailedJob.objects.exists()


@MODES
def test_rows_claimed_ahead_by_a_stalled_worker_run_only_at_their_new_owner(fleet, mode,
                                                                            tmp_path):
    """A worker stalled (SIGSTOP) past its lease holding rows claimed ahead (not started:
    the solo worker's batch, the prefetch buffer of threads and async slots) loses them to
    another worker; resumed, it must not run them: a deferred start has no statement of its
    own, so it is deferred only while the claim's lease surely holds, and rows started
    together are run only if their start found them held. Each runs once, at its new
    owner; the stalled worker logs them LOST."""
    record = chaos_jobs.AsyncRerunWaits if _is_async(mode) else chaos_jobs.RerunWaits
    busy = 4 if mode else 1  # every slot taken by a long job: the rest are claimed ahead
    workers = fleet("--sleep", "0.2", *mode,
                    env=chaos_env(JOBGUARD_COMPLETION_WINDOW="30", JOBGUARD_LOG_LEVEL="INFO",
                                  JOBGUARD_RETRY_AFTER="4"))
    (first,) = workers.start(1)
    record("warm").dispatch()  # a fast class here: the next starts are deferred
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=60, what="the warm-up ran")
    first_id = Worker.objects.get(pid=first.pid).id
    # The long ones wait at a gate opened once the worker is stopped: they keep its slots
    # until then however slow the test process (3 s alone was a hope).
    gate = tmp_path / "gate"
    with transaction.atomic():  # one commit: one claim takes the long ones and the rest
        for i in range(busy):
            record(f"long-{i}", seconds=3, gate=str(gate)).dispatch(priority=5)
        ahead = [record(f"ahead-{i}").dispatch(priority=1) for i in range(6)]
    label = chaos_jobs.RerunWaits.LABEL
    ids = [handle.id for handle in ahead]

    def held_ahead() -> list:
        return list(QueuedJob.objects.filter(id__in=ids, reserved_by=first_id)
                    .values_list("id", flat=True))

    wait_for(lambda: JobRun.objects.filter(label=label, key__startswith="long-",
                                           pid=first.pid).count() == busy and held_ahead(),
             timeout=60, what="the long jobs running and rows claimed ahead")
    first.send_signal(signal.SIGSTOP)  # no heartbeat renews its 4 s lease
    try:
        held = held_ahead()
        assert held and not JobRun.objects.filter(label=label, key__startswith="ahead-",
                                                  pid=first.pid).exists()
        wait_for(lambda: stopped(first.pid), timeout=10, interval=0.01,
                 what="the first worker stopped")
        gate.touch()
        (second,) = workers.start(1)
        wait_for(lambda: JobRun.objects.filter(label=label, key__startswith="ahead-")
                 .count() == len(ahead), timeout=90, what="the second worker ran them all")
    finally:
        first.send_signal(signal.SIGCONT)
    # Resumed, the first worker ends its long jobs, then meets the rows it held ahead.
    wait_for(lambda: all(any(f"[{row_id}]" in line and "LOST" in line
                             for line in workers.log_of(first).splitlines())
                         for row_id in held),
             timeout=60, what="the first worker found the rows it held ahead taken")
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=60, what="the queue drained")
    assert workers.stop_all() == [0, 0], workers.errors()
    runs = JobRun.objects.filter(label=label, key__startswith="ahead-")
    assert sorted(runs.values_list("key", flat=True)) == [f"ahead-{i}" for i in range(6)]
    assert set(runs.values_list("pid", flat=True)) == {second.pid}
    assert not FailedJob.objects.exists()
