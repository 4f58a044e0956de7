"""kill -9 of a worker that had claimed jobs ahead (``--batch``): only the jobs it had begun
may have used their try (issue 18 item 3).

A worker claiming five rows per round trip starts one and holds the other four on its lease.
Killed while its second job runs, it leaves behind rows it never began; once their lease runs
out the next worker must run them, not fail them as "attempted too many times (1 of 1)".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from tests.chaos.jobs import SecondRunWaits
from tests.support import MANAGE, ROOT, wait_for, worker_env

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: A short lease so the dead worker's rows come back quickly (the timeout must stay below it),
#: and a timeout six times as long as a job (SecondRunWaits has none: a held run waits).
ENV = {"JOBGUARD_RETRY_AFTER": "4", "JOBGUARD_DEFAULT_TIMEOUT": "3",
       "JOBGUARD_EXTRA_JOB_MODULES": "tests.chaos.jobs"}
TOTAL = 12
SECONDS = 0.5


def _start(*args: str) -> tuple[subprocess.Popen, object]:
    """A ``jobworker`` in its own process group (a supervisor dies with its children)."""
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed by the caller)
    proc = subprocess.Popen([sys.executable, str(MANAGE), "jobworker", "--tries", "1",
                             "--sleep", "0.2", *args], env=worker_env(**ENV), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=log, text=True,
                            start_new_session=True)
    return proc, log


def _kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # no cleanup, no release: leases run out by themselves
    proc.wait()


def _on_second_job(processes: int) -> bool:
    """Every worker process has begun its second job (one started after its first ended)."""
    pids = list(JobRun.objects.filter(label="ahead").values_list("pid", flat=True))
    return len({pid for pid in pids if pids.count(pid) >= 2}) == processes


@pytest.mark.parametrize("extra", [(), ("--concurrency", "2")], ids=["one", "concurrency-2"])
def test_jobs_claimed_ahead_by_a_killed_worker_run_later(extra, tmp_path):
    processes = 2 if extra else 1
    # A process's second job waits at a gate opened after the kill: each is killed on its
    # second job, the rest of its batch claimed ahead, however slow the test process (0.5 s
    # jobs let a stalled test find the batch run through, and nothing claimed ahead).
    gate = tmp_path / "gate"
    handles = dispatch_many([SecondRunWaits("ahead", str(i), str(gate), seconds=SECONDS)
                             for i in range(TOTAL)])
    ids = {h.id for h in handles}
    first, log = _start("--batch", "5", *extra)
    try:
        wait_for(lambda: first.poll() is not None or _on_second_job(processes), timeout=60)
        if first.poll() is not None:
            log.seek(0)
            raise AssertionError(f"the worker exited {first.returncode}:\n{log.read()[-3000:]}")
        _kill_group(first)
        gate.touch()
        killed_runs = {r.job_id: r for r in JobRun.objects.filter(label="ahead")}
        # Begun: a job that recorded its run, or whose row counts an attempt (the kill may come
        # between a row's start and its job's first statement: no run recorded, try used).
        started = {str(pk) for pk in QueuedJob.objects.filter(
            attempts__gt=0).values_list("id", flat=True)}
        # One job at a time per process: rows claimed ahead have not used their try.
        assert len(started) <= processes, (started, processes)
        begun = set(killed_runs) | started
        claimed = QueuedJob.objects.filter(reserved_at__isnull=False).count()
        assert claimed > len([r for r in killed_runs.values() if r.ended_at is None]), (
            "the killed worker held no job claimed ahead; nothing to test")
        wait_for(lambda: not QueuedJob.objects.reserved().exists(), timeout=30)

        second, second_log = _start("--stop-when-empty")
        try:
            assert second.wait(timeout=120) == 0
        finally:
            second_log.close()
    finally:
        if first.poll() is None:
            _kill_group(first)
        log.close()

    assert not QueuedJob.objects.exists()  # nothing lost, nothing left reserved
    runs: dict[str, list[JobRun]] = {}
    for run in JobRun.objects.filter(label="ahead").order_by("id"):
        runs.setdefault(run.job_id, []).append(run)
    failed = {str(f.id): f for f in FailedJob.objects.all()}
    assert set(runs) | set(failed) == ids  # every job ran or, begun when killed, failed
    # Only a job the killed worker had begun may have used its one try ...
    assert set(failed) <= begun, (set(failed) - begun, [f.message for f in failed.values()])
    for job_id, job_runs in runs.items():
        if job_id in begun:
            continue
        # ... every other job ran once, to its end, on its first attempt.
        assert [(r.attempt, r.ended_at is not None) for r in job_runs] == [(1, True)], job_runs
    for job_id in begun - set(failed):  # a job the killed worker finished is not failed
        assert any(r.ended_at is not None for r in runs.get(job_id, [])), job_id
