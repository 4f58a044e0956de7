"""Jobs done in the last minute, as counted by real worker processes at their heartbeats."""

from __future__ import annotations

import signal

import pytest

from django_jobguard import dispatch_many, operations
from tests.support import jobs, wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_stats_sum_what_live_workers_finished_in_the_last_minute(workers):
    env = worker_env(JOBGUARD_RETRY_AFTER="1.5", JOBGUARD_DEFAULT_TIMEOUT="1")  # 0.5 s beats
    pool = workers(2, "--sleep", "0.1", "--max-time", "120", env=env)
    # Both workers register before any job exists, so one cannot finish them all alone
    # before the other is even counted.
    wait_for(lambda: operations.stats()["workers"] == 2)
    dispatch_many([jobs.Noop(n) for n in range(6)] + [jobs.FailMe()])
    stats = wait_for(lambda: (s := operations.stats())["done_last_minute"] == 6
                     and s["failed_last_minute"] == 1 and s)
    assert stats["workers"] == 2
    assert stats["queues"]["default"]["failed"] == 1
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    pool.wait(30)
    assert operations.stats()["done_last_minute"] == 0  # exited workers no longer count
