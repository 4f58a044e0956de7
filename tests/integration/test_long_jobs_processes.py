"""Long jobs across real processes on the real test database (docs/long-jobs.md): a debounce
storm from 3 processes of 20 threads, a steady stream of dispatches that max_wait keeps from
starving, and waiting for a result a worker process writes (woken by NOTIFY on PostgreSQL)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
from demo.models import JobRun

from django_jobguard.dialects import dialect_for
from django_jobguard.models import QueuedJob, Worker
from tests.support import ROOT, requires_postgres, start_workers, wait_for, worker_env
from tests.support.long_jobs import DebouncedRecord, Sleeper

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: Dispatches in the storm: 300 in CI; JOBGUARD_TEST_DEBOUNCE_STORM=1000 for the issue's size.
STORM = int(os.environ.get("JOBGUARD_TEST_DEBOUNCE_STORM", "300"))


def storm(processes: int, threads: int, per_thread: int, tmp_path) -> list[dict]:
    """Start ``processes`` copies of tests/support/debounce_script.py, release them at once."""
    go = tmp_path / "go"
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "testproject"), env["PYTHONPATH"]])
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.debounce_script",
                               str(threads), str(per_thread), str(go)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(processes)]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read()
        go.touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_storm_of_dispatches_of_one_key_runs_once_with_the_last_arguments(tmp_path):
    per_thread = math.ceil(STORM / 60)
    results = storm(3, 20, per_thread, tmp_path)
    total = 60 * per_thread
    assert [r["errors"] for r in results] == [[], [], []]
    assert sum(r["inserted"] for r in results) == 1
    assert sum(r["folded"] for r in results) == total - 1
    row = QueuedJob.objects.get()  # one waiting job, every dispatch given its id
    assert {i for r in results for i in r["ids"]} == {str(row.id)}
    assert row.debounce_folds == total - 1  # no fold lost to a race

    last = DebouncedRecord("storm", "final").dispatch(debounce=(0.2, 600))
    assert last.folded and last.id == str(row.id)
    pool = start_workers(1, "--max-jobs", "1", "--sleep", "0.1")
    pool.wait(timeout=60)
    assert list(JobRun.objects.values_list("label", flat=True)) == ["final"]
    assert not QueuedJob.objects.exists()


def test_steady_dispatches_run_at_least_once_per_max_wait(tmp_path):
    """A dispatch every second with debounce (2 s, max_wait 3 s): seconds alone would put
    the job off for ever; max_wait makes it due 3 s after the first dispatch of each row,
    so it runs while the dispatches go on, each run with the last arguments folded into it."""
    pool = start_workers(1, "--sleep", "0.1", "--max-time", "40")
    try:
        wait_for(Worker.objects.exists, timeout=30, what="the worker to start")
        last_of: dict[str, str] = {}
        for i in range(10):
            result = DebouncedRecord("steady", str(i)).dispatch(debounce=(2, 3))
            last_of[result.id] = str(i)
            waiting = QueuedJob.objects.filter(id=result.id, reserved_at__isnull=True).first()
            if waiting is not None:  # never due past its deadline
                assert waiting.available_at <= waiting.debounce_deadline
            time.sleep(1)  # the pace of the stream, not a wait for an outcome
        ran_during_stream = JobRun.objects.count()
        wait_for(lambda: not QueuedJob.objects.exists(), timeout=30,
                 what="the last debounced job to run")
    finally:
        pool.kill()
    assert ran_during_stream >= 1  # not starved by the steady stream
    runs = dict(JobRun.objects.values_list("job_id", "label"))
    assert runs == last_of  # every row ran once, with the last arguments folded into it
    assert len(runs) >= 2


def test_wait_returns_the_result_a_worker_process_wrote():
    handle = Sleeper("awaited", seconds=0.3, value={"rows": 12}).dispatch()
    pool = start_workers(1, "--max-jobs", "1", "--sleep", "0.1")
    try:
        assert handle.wait(timeout=60) == {"rows": 12}
    finally:
        pool.wait(timeout=60)


@requires_postgres
def test_on_postgresql_the_worker_notifies_waiters_when_it_writes_the_result():
    """The NOTIFY that wakes ``wait()`` is sent by the worker's ack (with the result row, in
    its transaction): a listener hears the job's id."""
    listener = dialect_for("default").listen_results()
    assert listener is not None
    try:
        handle = Sleeper("notified", value=1).dispatch()
        pool = start_workers(1, "--max-jobs", "1", "--sleep", "0.1")
        heard: set[str] = set()
        wait_for(lambda: heard.update(listener.wait(0.5)) or handle.id in heard, timeout=60,
                 what="the result's NOTIFY")
        pool.wait(timeout=60)
    finally:
        listener.close()
    assert handle.wait(timeout=5) == 1
