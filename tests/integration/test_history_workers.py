"""The finished-run statistics with real worker processes: several workers add the runs they
record to the same per-minute and per-hour rows at their heartbeats and at exit (additive
upserts), and the statistics count every run once."""

from __future__ import annotations

import signal

import pytest
from demo.models import JobRun
from django.db.models import Sum

from django_jobguard import dispatch_many, history
from django_jobguard.models import FinishedRun, RunStatistic
from django_jobguard.models import Worker as WorkerRow
from tests.support import jobs, wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_workers_statistics_count_each_run_once(workers, tmp_path):
    env = worker_env(JOBGUARD_HISTORY="all", JOBGUARD_RETRY_AFTER="1.5",  # 0.5 s beats
                     JOBGUARD_DEFAULT_TIMEOUT="1")
    # The three workers are up and polling before the jobs come, so that each takes some
    # (started after a dispatch, the first one up could drain the queue alone).
    pool = workers(3, "--queue", "stats", "--sleep", "0.05", "--max-time", "120", env=env)
    wait_for(lambda: WorkerRow.objects.count() == 3, timeout=60, what="three workers up")
    # The jobs wait at a gate until two workers run one: a worker stalled for the second or
    # two the queue takes could leave one worker to record every run.
    gate = tmp_path / "gate"
    dispatch_many([jobs.Record("stats", key=str(n), seconds=0.01, gate=str(gate))
                   for n in range(240)] + [jobs.FailMe() for _ in range(10)], queue="stats")
    wait_for(lambda: len(set(JobRun.objects.values_list("pid", flat=True))) >= 2, timeout=60,
             what="two workers running jobs")
    gate.touch()
    wait_for(lambda: FinishedRun.objects.filter(queue="stats").count() == 250, timeout=120,
             what="250 runs recorded")
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    pool.wait(60)  # their last statistics are written as they stop
    runs = FinishedRun.objects.filter(queue="stats")
    assert runs.count() == 250 and runs.filter(state="FAILED").count() == 10
    assert runs.values("worker").distinct().count() >= 2  # several workers recorded
    for span in history.SPANS:
        rows = RunStatistic.objects.filter(span=span, queue="stats")
        summary = rows.filter(bucket=history.SUMMARY).aggregate(
            runs=Sum("runs"), failures=Sum("failures"))
        assert summary == {"runs": 250, "failures": 10}, span
        buckets = rows.exclude(bucket=history.SUMMARY).aggregate(
            runtimes=Sum("runtimes"), waits=Sum("waits"))
        assert buckets == {"runtimes": runs.filter(runtime__isnull=False).count(),
                           "waits": runs.filter(wait__isnull=False).count()}, span
    exact = {r["name"]: r for r in history.run_statistics("1h")}
    estimated = {r["name"]: r for r in history.run_statistics("1h", exact_up_to=0)}
    assert set(exact) == set(estimated)
    for name, row in estimated.items():
        assert (row["runs"], row["failures"]) == (exact[name]["runs"], exact[name]["failures"])
        assert row["runtime_max"] == pytest.approx(exact[name]["runtime_max"])
