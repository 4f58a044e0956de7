"""The dashboard's history with real worker processes: each worker adds its per-queue counts
to the minute rows at its heartbeats, and the history shows every job they ran, once."""

from __future__ import annotations

import signal

import pytest

from django_jobguard import dispatch_many, operations
from django_jobguard.models import QueueMinute
from tests.support import jobs, wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _last_hour(name: str) -> tuple[int, int]:
    counts = operations.overview()["queues"].get(name, {})
    return counts.get("done_last_hour", 0), counts.get("failed_last_hour", 0)


def test_history_shows_the_jobs_real_workers_ran(workers):
    env = worker_env(JOBGUARD_RETRY_AFTER="1.5", JOBGUARD_DEFAULT_TIMEOUT="1")  # 0.5 s beats
    pool = workers(2, "--queue", "mail,pdf", "--sleep", "0.1", "--max-time", "120", env=env)
    wait_for(lambda: len(operations.overview()["workers"]) == 2, what="2 workers alive")
    dispatch_many([jobs.Noop(n) for n in range(8)], queue="mail")
    dispatch_many([jobs.Noop(n) for n in range(3)] + [jobs.FailMe(), jobs.FailMe()],
                  queue="pdf")
    # Written by the heartbeats of running workers (not only when they exit).
    wait_for(lambda: _last_hour("mail") == (8, 0) and _last_hour("pdf") == (3, 2),
             timeout=60, what="the history counts every job the workers ran")
    data = operations.overview()
    assert {w["id"].rsplit(":", 2)[0] for w in data["workers"]}  # live, with their queues
    assert all(w["queues"] == ["mail", "pdf"] for w in data["workers"])
    assert sum(data["history"]["1h"]["queues"]["mail"]["done"]) == 8
    assert data["queues"]["pdf"]["failed"] == 2  # the failed jobs are kept too
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    pool.wait(30)
    # Nothing counted twice by the flush at exit, and no row per worker: one per minute.
    assert _last_hour("mail") == (8, 0) and _last_hour("pdf") == (3, 2)
    assert QueueMinute.objects.filter(queue="mail").count() <= 2  # the minute may turn


def test_a_worker_that_exits_before_its_first_heartbeat_still_counts(workers):
    dispatch_many([jobs.Noop(n) for n in range(3)], queue="quick")
    # The default RETRY_AFTER (90 s) beats every 15 s: the worker is gone before that.
    workers(1, "--queue", "quick", "--stop-when-empty", "--max-time", "60").wait(60)
    assert _last_hour("quick") == (3, 0)
