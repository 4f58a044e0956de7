"""kill -9 of workers whose finished jobs wait for their completion group (issue 29).

With ``COMPLETION_WINDOW`` a worker acks finished jobs in groups (worker/completer.py). What
a kill may cost (docs/guarantees.md#batched-completion): the jobs that finished or started in
the last window run again, and that re-run uses no try; a row whose worker vanished starts
with its attempt written, so a job that kills its worker still ends by its ``tries``.
"""

from __future__ import annotations

import os
import random

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from tests.chaos.conftest import LONG_LEASE, Outcome, chaos_env
from tests.chaos.jobs import RecordOrDie
from tests.support import POSTGRES, async_jobs, jobs, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not POSTGRES, reason="batched completion is PostgreSQL's")]


def _runs(key: str) -> list[JobRun]:
    return list(JobRun.objects.filter(label="completion", key=key).order_by("id"))


def test_a_finished_job_whose_group_was_lost_runs_again_without_using_a_try(fleet, tmp_path):
    # A wide window, so that the kill lands while the group waits: the warm-up runs teach
    # the worker that the class is fast (its first run starts with its attempt written),
    # "done" finishes, "long" starts, and the worker dies before the group is written.
    # "long" waits at a gate opened once the worker is dead: it keeps the worker busy (the
    # group unwritten) until the kill however slow the test process (2 s was a hope).
    gate = tmp_path / "gate"
    for i in range(3):
        RecordOrDie(f"warm-{i}").dispatch(priority=9)
    done = RecordOrDie("done").dispatch(priority=5)
    RecordOrDie("long", seconds=2, gate=str(gate)).dispatch(priority=1)
    workers = fleet("--sleep", "0.2", env=chaos_env(JOBGUARD_COMPLETION_WINDOW="30",
                                                    JOBGUARD_RETRY_AFTER="2"))
    (first,) = workers.start(1)
    wait_for(lambda: len(_runs("long")) == 1, timeout=60, what="the long job started")
    assert _runs("done")[0].ended_at is not None
    workers.kill(first)
    gate.touch()
    assert QueuedJob.objects.filter(id=done.id).exists()  # its ack was not written

    workers.start(1)  # takes the rows once their lease (2 s) ran out
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=60, what="the queue drained")
    assert workers.stop_all() == [0], workers.errors()
    assert not FailedJob.objects.exists(), workers.errors()  # tries = 1, nothing failed
    done, long = _runs("done"), _runs("long")
    assert [r.pid for r in done] == [first.pid, done[1].pid] and done[1].pid != first.pid
    assert [r.attempt for r in done] == [1, 1]  # the re-run used no try
    assert [r.attempt for r in long] == [1, 1] and long[1].ended_at is not None
    # The group also held the warm-up runs after the first, which ran again the same way.
    for i in range(3):
        assert all(r.attempt == 1 for r in _runs(f"warm-{i}"))


def test_a_job_that_kills_its_worker_is_counted_from_its_second_run(fleet):
    # Its first run started within the window (a fast class): no attempt written when it
    # killed its worker. Taken back from the vanished worker, it starts with its attempt
    # written, kills the next worker too, and then fails by its tries (1) for good.
    for i in range(2):
        RecordOrDie(f"warm-{i}").dispatch(priority=9)
    RecordOrDie("dies", die=True).dispatch()
    # A window the warm-up runs end within however loaded the machine is (with 0.05 s a
    # slow warm-up in .ci/run made the class slow: its first run's attempt was written).
    workers = fleet("--sleep", "0.2", env=chaos_env(JOBGUARD_COMPLETION_WINDOW="1"))
    for run in (1, 2):
        workers.start(1)
        wait_for(lambda run=run: len(_runs("dies")) == run and not workers.alive,
                 timeout=60, what=f"run {run} killed its worker")
    workers.start(1)
    wait_for(lambda: FailedJob.objects.exists(), timeout=60, what="the job failed")
    assert workers.stop_all() == [0], workers.errors()
    (failed,) = FailedJob.objects.all()
    assert failed.exception_class.endswith("MaxAttemptsExceededError"), failed.message
    assert [r.attempt for r in _runs("dies")] == [1, 1]
    assert not QueuedJob.objects.exists()


@pytest.mark.parametrize("mode", [(), ("--threads", "4"), ("--async-concurrency", "4")],
                         ids=["solo", "threads", "async"])
def test_kill_9_while_groups_wait_loses_nothing_and_spends_no_try(fleet, mode):
    # The full size (30 kills over 20,000 jobs) on demand; CI runs a fifth of it.
    total = int(os.environ.get("JOBGUARD_CHAOS_COMPLETION_JOBS", "4000"))
    kills = int(os.environ.get("JOBGUARD_CHAOS_COMPLETION_KILLS", "12"))
    processes = 3
    record = async_jobs.AsyncRecord if "--async-concurrency" in mode else jobs.Record
    handles = dispatch_many([record("completion", key=str(i)) for i in range(total)])
    workers = fleet("--sleep", "0.2", "--tries", "2", *mode,
                    env=chaos_env(**LONG_LEASE, JOBGUARD_COMPLETION_WINDOW="0.02"))
    workers.start(processes)
    rng = random.Random()  # seeded by pytest-randomly
    for k in range(1, kills + 1):
        wait_for(lambda k=k: JobRun.objects.filter(label="completion").count()
                 >= k * total // (kills + 2), timeout=120)
        workers.kill(rng.choice(workers.alive))
        workers.start(1)
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=max(180, total / 20))
    codes = workers.stop_all()
    assert codes and all(code == 0 for code in codes), workers.errors()

    out = Outcome.read((str(h.id) for h in handles), "completion")
    assert out.queued == 0, workers.errors()[-3000:]
    # A try is spent only by a kill that cut a run with its attempt written (counted by
    # its claim, or its start written by the group while it ran), or that came between a
    # counting claim and the run: a job fails only by two such kills in a row (tries=2),
    # in workers that were killed, as without the window.
    for job_id in out.failed:
        runs = out.runs.get(job_id, [])
        assert runs and all(r["pid"] in workers.killed for r in runs), (job_id, runs)
        assert runs[-1]["attempt"] == 2, (job_id, runs)
    assert out.completed == out.ids - set(out.failed)  # every other job ran to its end
    reruns = spent = 0
    for job_id, runs in out.runs.items():
        for run in runs[:-1]:  # every run but the last was in a worker that was killed
            assert run["pid"] in workers.killed, (job_id, runs)
        reruns += len(runs) - 1
        attempts = [r["attempt"] for r in runs]
        assert attempts == sorted(attempts) and attempts[-1] <= 2, (job_id, runs)
        spent += 2 if job_id in out.failed else attempts[-1] - 1
    # A kill spends the tries of the rows its worker held counted: a few (4 slots), never
    # those of the finished runs its lost groups held (those re-run with the same attempt).
    print(f"{reruns} re-runs, {spent} tries spent, {len(out.failed)} failed, {kills} kills")
    assert spent <= kills * 8, (spent, reruns)
    survivors = [r for runs in out.runs.values() for r in runs
                 if r["pid"] not in workers.killed]
    assert len({r["job_id"] for r in survivors}) == len(survivors)  # never twice
    # Bounded by the window: a kill costs the runs of the last group, not the backlog.
    assert reruns <= kills * 200, reruns
