"""The prefetch buffer of ``--threads`` and of the async executor (issue 29): rows claimed
ahead for the slots, not started, are never lost and never spend an attempt.

- kill -9 of a worker with rows in its buffer: they come back when their lease runs out and
  run once, on their first attempt (``--tries 1``: a row whose try had been used would fail
  as "attempted too many times"); only the jobs running at the kill may have used theirs;
- a graceful stop (SIGTERM) gives the buffered rows back at once, attempts unused: another
  worker can claim them without waiting for a lease;
- a row that waits in the buffer longer than the lease keeps it (the heartbeat renews it):
  a second worker never takes it;
- pausing its queue, or quieting the worker from the console, gives the buffered rows back
  (attempts unused) while the running jobs go on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from demo.models import JobRun

from django_jobguard import dispatch, dispatch_many
from django_jobguard.models import QUIET, FailedJob, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.operations import pausing
from tests.chaos.conftest import stopped
from tests.support import MANAGE, ROOT, async_jobs, jobs, wait_for, worker_env

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: A short lease so a killed worker's rows come back quickly (jobs last 20 ms).
ENV = {"JOBGUARD_RETRY_AFTER": "4", "JOBGUARD_DEFAULT_TIMEOUT": "3"}
TOTAL = 400
SECONDS = 0.02  # short jobs: the buffer keeps up to one row per slot ready
MODES = {"threads-4": ("--threads", "4"), "async-4": ("--async-concurrency", "4")}


def _record(mode: str, label: str, key: str, seconds: float, gate: str = "",
            gate_after: int = 0):
    if mode.startswith("async"):
        return async_jobs.AsyncRecord(label, key=key, seconds=seconds, gate=gate,
                                      gate_after=gate_after)
    return jobs.Record(label, key=key, seconds=seconds, gate=gate, gate_after=gate_after)


def _start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, object]:
    """A ``jobworker`` in its own process group, its stderr kept for the failure message."""
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed by the caller)
    proc = subprocess.Popen([sys.executable, str(MANAGE), "jobworker", "--sleep", "0.2",
                             *args], env=worker_env(**(env or ENV)), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=log, text=True,
                            start_new_session=True)
    return proc, log


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # no cleanup: leases run out by themselves
    proc.wait()


def _log_of(proc: subprocess.Popen, log) -> str:
    log.seek(0)
    return f"the worker exited {proc.returncode}:\n{log.read()[-3000:]}"


def _drain(*args: str) -> None:
    """A second worker runs what is left, then exits."""
    second, log = _start("--stop-when-empty", *args)
    try:
        assert second.wait(timeout=180) == 0, _log_of(second, log)
    finally:
        _kill_group(second)
        log.close()


def _holds_buffered_rows(label: str) -> bool:
    """Some jobs ran (the buffer's target needs an average), and rows are reserved with
    their attempt uncounted: claimed ahead into the buffer."""
    return (JobRun.objects.filter(label=label, ended_at__isnull=False).count() >= 40
            and QueuedJob.objects.filter(reserved_at__isnull=False, attempts=0).exists())


@contextlib.contextmanager
def _buffering(mode: str, label: str, *, frozen: bool = False, gate: str = "",
               ) -> Iterator[tuple[set[str], subprocess.Popen, Any]]:
    """``TOTAL`` short jobs and a worker (``--tries 1``) that holds some in its buffer: the
    jobs' ids, the worker and its log; the worker is killed and its log closed after.
    ``frozen``: the worker is stopped (SIGSTOP) when it is handed over, and its buffer was
    seen holding rows while it was stopped (a buffer turns over every 20 ms: seen running,
    it may have started them all before the caller acts). ``gate``: the jobs that start
    once a quarter of them ended wait for that file, so the worker stops there, its buffer
    full (counted, not by their place in the dispatch: MariaDB claims rows whose times tie
    in the order of their ids, UUIDs)."""
    ids = {h.id for h in dispatch_many([
        _record(mode, label, str(i), SECONDS, gate, TOTAL // 4 if gate else 0)
        for i in range(TOTAL)])}
    first, log = _start("--tries", "1", *MODES[mode])
    try:
        for _ in range(20):
            wait_for(lambda: first.poll() is not None or _holds_buffered_rows(label),
                     timeout=60, interval=0.01, what="a buffered row")
            assert first.poll() is None, _log_of(first, log)
            if not frozen:
                break
            os.killpg(first.pid, signal.SIGSTOP)
            wait_for(lambda: stopped(first.pid), timeout=10, interval=0.01,
                     what="the worker stopped")
            if _holds_buffered_rows(label):
                break
            os.killpg(first.pid, signal.SIGCONT)
        else:
            raise AssertionError("the worker's buffer was empty each time it was stopped")
        yield ids, first, log
    finally:
        _kill_group(first)
        log.close()


def _runs(label: str) -> dict[str, list[JobRun]]:
    runs: dict[str, list[JobRun]] = {}
    for run in JobRun.objects.filter(label=label).order_by("id"):
        runs.setdefault(run.job_id, []).append(run)
    return runs


@pytest.mark.parametrize("mode", list(MODES))
def test_rows_buffered_by_a_killed_worker_run_later_on_their_first_attempt(mode):
    label = f"prefetch-kill-{mode}"
    # Kill while the buffer holds rows: reserved, their attempt not counted (not begun).
    with _buffering(mode, label, frozen=True) as (ids, first, _log):
        _kill_group(first)
    # What the kill left: begun = a recorded run, or a row whose attempt is counted.
    begun = set(_runs(label)) | {str(pk) for pk in QueuedJob.objects.filter(
        attempts__gt=0).values_list("id", flat=True)}
    started_unfinished = QueuedJob.objects.filter(attempts__gt=0).count()
    assert started_unfinished <= 4, started_unfinished  # only the running jobs counted
    buffered = {str(pk) for pk in QueuedJob.objects.filter(
        reserved_at__isnull=False, attempts=0).values_list("id", flat=True)}
    assert buffered and not buffered & begun
    wait_for(lambda: not QueuedJob.objects.reserved().exists(), timeout=30)  # leases ran out

    _drain(*MODES[mode], "--tries", "1")

    assert not QueuedJob.objects.exists()  # nothing lost, nothing left reserved
    runs = _runs(label)
    failed = {str(f.id): f for f in FailedJob.objects.all()}
    assert set(runs) | set(failed) == ids  # every job ran or, begun when killed, failed
    # Only a job running at the kill may have used its one try ...
    assert set(failed) <= begun, [f.message for k, f in failed.items() if k not in begun]
    for job_id in buffered:  # ... a buffered row ran once, to its end, on its first attempt
        assert [(r.attempt, r.ended_at is not None) for r in runs[job_id]] == [(1, True)]
    for job_id, job_runs in runs.items():
        if job_id not in begun:
            assert [(r.attempt, r.ended_at is not None) for r in job_runs] == [(1, True)]


@pytest.mark.parametrize("mode", list(MODES))
def test_a_graceful_stop_gives_the_buffered_rows_back_at_once(mode, tmp_path):
    label = f"prefetch-stop-{mode}"
    # The jobs wait at a gate opened once the SIGTERM was sent: the stop comes before the
    # end however slow the test process (400 jobs of 20 ms, about 2 s, were a hope).
    gate = tmp_path / "gate"
    with _buffering(mode, label, gate=str(gate)) as (ids, first, log):
        os.killpg(first.pid, signal.SIGTERM)
        gate.touch()
        assert first.wait(timeout=60) == 0, _log_of(first, log)
    # Nothing held any more (no lease to wait for), no attempt used by a row not run.
    assert not QueuedJob.objects.filter(reserved_at__isnull=False).exists()
    assert not QueuedJob.objects.filter(attempts__gt=0).exists()
    assert QueuedJob.objects.exists()  # the stop came before the end: some were given back

    _drain(*MODES[mode], "--tries", "1")

    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    runs = _runs(label)
    assert set(runs) == ids
    for job_runs in runs.values():  # every job once, on its first attempt
        assert [(r.attempt, r.ended_at is not None) for r in job_runs] == [(1, True)]


@pytest.mark.parametrize("mode", ["threads-2", "async-2"])
def test_a_buffered_row_keeps_its_lease_past_the_lease_time(mode, tmp_path):
    """A short job waits in the buffer behind a long one past its lease (2 s): the
    heartbeat renews its lease, so a second worker started meanwhile never takes it."""
    # The long ones wait at a gate opened once the second worker is up past the short row's
    # first lease: with 6 s jobs a stalled test process started the second worker after the
    # short one had run, and nothing was checked.
    gate = tmp_path / "gate"
    # (``--threads 1`` is the solo executor: one job at a time in the main thread)
    args = ("--threads", "2") if mode == "threads-2" else ("--async-concurrency", "2")
    env = {"JOBGUARD_RETRY_AFTER": "2", "JOBGUARD_DEFAULT_TIMEOUT": "0"}
    label = f"prefetch-lease-{mode}"
    first, log = _start("--tries", "1", *args, env=env)
    second = second_log = None
    try:
        # Short jobs first: the buffer's target (one row) needs a recent average.
        dispatch_many([_record(mode, label, f"warm-{i}", 0.0) for i in range(20)])
        wait_for(lambda: not QueuedJob.objects.exists(), timeout=60)
        dispatch_many([_record(mode, label, "long", 0.5, str(gate))
                       for _ in range(2)])  # both slots
        wait_for(lambda: JobRun.objects.filter(label=label, key="long").count() == 2,
                 timeout=30)
        short = dispatch(_record(mode, label, "short", 0.0))
        wait_for(lambda: QueuedJob.objects.filter(id=short.id, reserved_at__isnull=False)
                 .exists(), timeout=10, what="the short job buffered")
        reserved = QueuedJob.objects.get(id=short.id)
        assert reserved.attempts == 0  # buffered: claimed ahead, not started
        # Without renewal its 2 s lease would run out while "long" runs, and this idle
        # worker would take it.
        second, second_log = _start("--tries", "1", *args, env=env)
        seen = wait_for(lambda: WorkerRow.objects.filter(
            pid=second.pid, last_seen_at__gt=reserved.available_at).values_list(
            "last_seen_at", flat=True).first(), timeout=30,
            what="the second worker up after the short row's first lease ran out")
        # One more heartbeat of it: it had claim rounds (--sleep 0.2) meanwhile.
        wait_for(lambda: WorkerRow.objects.filter(pid=second.pid, last_seen_at__gt=seen)
                 .exists(), timeout=30, what="another heartbeat of the second worker")
        gate.touch()
        wait_for(lambda: not QueuedJob.objects.exists(), timeout=30)
    finally:
        for proc, out in ((first, log), (second, second_log)):
            if proc is not None:
                _kill_group(proc)
                out.close()
    [run] = JobRun.objects.filter(label=label, key="short")
    long_runs = JobRun.objects.filter(label=label, key="long")
    assert (run.pid, run.attempt) == (first.pid, 1)  # the first worker's, its first attempt
    # It waited in the buffer for a slot, longer than its lease.
    assert run.started_at >= min(r.ended_at for r in long_runs)


@pytest.mark.parametrize("how", ["pause", "quiet"])
def test_pausing_the_queue_or_quieting_the_worker_gives_the_buffered_rows_back(how, tmp_path):
    """Two long jobs fill the slots of ``--threads 2``; the short jobs dispatched then wait in
    the buffer. A pause of their queue (checked once a second) or a quiet command (read by
    the heartbeat) puts them back, unreserved and with no attempt used; the long jobs finish."""
    env = {"JOBGUARD_RETRY_AFTER": "3", "JOBGUARD_DEFAULT_TIMEOUT": "0"}
    label = f"prefetch-{how}"
    first, log = _start("--tries", "1", "--threads", "2", env=env)
    try:
        dispatch_many([jobs.Record(label, key=f"warm-{i}") for i in range(20)])
        wait_for(lambda: not QueuedJob.objects.exists(), timeout=60)
        # The long jobs wait at a gate opened once the rows were given back: they fill the
        # slots until then however slow the test process (5 s each was a hope).
        gate = tmp_path / "gate"
        dispatch_many([jobs.Record(label, key="long", gate=str(gate)) for _ in range(2)])
        wait_for(lambda: JobRun.objects.filter(label=label, key="long").count() == 2,
                 timeout=30)
        short = {h.id for h in dispatch_many([jobs.Record(label, key=f"short-{i}")
                                               for i in range(2)])}
        wait_for(lambda: QueuedJob.objects.filter(id__in=short, reserved_at__isnull=False,
                                                  attempts=0).count() == 2,
                 timeout=10, what="the short jobs buffered")
        if how == "pause":
            pausing.pause("default", force=True)
        else:
            WorkerRow.objects.update(command=QUIET)
        wait_for(lambda: QueuedJob.objects.filter(id__in=short, reserved_at__isnull=True,
                                                  attempts=0).count() == 2,
                 timeout=10, what="the buffered rows given back")
        gate.touch()
        # The long jobs were not disturbed; the short ones did not run here.
        wait_for(lambda: JobRun.objects.filter(label=label, key="long",
                                               ended_at__isnull=False).count() == 2,
                 timeout=30)
        assert not JobRun.objects.filter(label=label, key__startswith="short").exists()
        assert first.poll() is None, _log_of(first, log)
    finally:
        _kill_group(first)
        log.close()
