"""Fair share across worker processes (django_jobguard/fair_share.py): a queue's
``per_key_concurrency`` holds across three ``jobworker`` processes of three threads each
(the runs of each key never overlap more than the cap), and every job runs exactly once."""

from __future__ import annotations

import json
import signal
from collections import Counter, defaultdict

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from tests.support import jobs, ran_at_once, wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TENANTS = {"big": 8, "mid": 4, "small": 2}
CAP = 2


def test_per_key_concurrency_holds_across_three_worker_processes(workers):
    env = worker_env(JOBGUARD_QUEUES=json.dumps({"tenants": {"per_key_concurrency": CAP}}))
    pool = workers(3, "--threads", "3", "--queue", "tenants", "--sleep", "0.1", env=env)
    wait_for(lambda: WorkerRow.objects.count() == 3, timeout=60, what="workers up")
    for tenant, count in TENANTS.items():
        dispatch_many([jobs.Record("fair", key=tenant, seconds=0.3) for _ in range(count)],
                      queue="tenants", fair_key=tenant)
    total = sum(TENANTS.values())
    wait_for(lambda: JobRun.objects.filter(label="fair", ended_at__isnull=False).count() == total,
             timeout=120, what=f"all {total} jobs ran")
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    pool.wait(60)
    runs = list(JobRun.objects.filter(label="fair").values("key", "job_id", "started_at",
                                                           "ended_at"))
    assert len(runs) == total
    assert set(Counter(run["job_id"] for run in runs).values()) == {1}  # each exactly once
    by_key = defaultdict(list)
    for run in runs:
        by_key[run["key"]].append(run)
    assert {key: len(key_runs) for key, key_runs in by_key.items()} == TENANTS
    at_once = {key: ran_at_once(key_runs) for key, key_runs in by_key.items()}
    assert all(n <= CAP for n in at_once.values()), at_once
    assert at_once["big"] == CAP, at_once  # the cap was used, not just kept
    assert not QueuedJob.objects.exists()
