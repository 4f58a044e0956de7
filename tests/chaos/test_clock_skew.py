"""A worker whose clock is 5 minutes off (``time.time`` and ``timezone.now`` patched by
tests/chaos/skewed_settings.py) must not change what is due or which lock is alive: both
follow the database clock (and Redis's ``TIME`` for the Redis store).

(On SQLite the "database clock" is the host's C clock inside the worker process, which the
patch does not move either; on one host every process shares it.)
"""

from __future__ import annotations

import datetime

import pytest
from demo.models import JobRun
from django.utils import timezone

from django_jobguard import dispatch_many
from django_jobguard.models import QueuedJob
from django_jobguard.stores import get_store
from django_jobguard.worker import Worker, WorkerOptions
from tests.chaos import jobs as chaos_jobs
from tests.chaos.conftest import chaos_env
from tests.support import jobs, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

SKEW = 300.0


def skewed_env(skew: float) -> dict[str, str]:
    return chaos_env(DJANGO_SETTINGS_MODULE="tests.chaos.skewed_settings",
                     JOBGUARD_CLOCK_SKEW=str(skew))


def _run_once(workers, skew: float) -> str:
    return workers(1, "--stop-when-empty", "--sleep", "0", env=skewed_env(skew)).wait(60)[0]


@pytest.mark.django_db(transaction=True)
def test_fast_clock_does_not_run_delayed_jobs_early(workers):
    later, now = dispatch_many([jobs.Record("later")], delay=60) + dispatch_many(
        [jobs.Record("now")])
    _run_once(workers, SKEW)
    ran = JobRun.objects.get(label="now")
    # the patch was live: the job saw a clock 5 minutes ahead...
    assert (ran.started_at - timezone.now()).total_seconds() > SKEW - 60
    # ...yet the job delayed by 60 s (by the database clock) was not taken
    row = QueuedJob.objects.get(id=later.id)
    assert row.attempts == 0 and row.reserved_at is None
    assert not JobRun.objects.filter(label="later").exists()


@pytest.mark.django_db(transaction=True)
def test_slow_clock_still_runs_due_jobs(workers):
    handle = jobs.Record("due").dispatch()
    _run_once(workers, -SKEW)
    ran = JobRun.objects.get(label="due")
    assert ran.job_id == handle.id
    assert (timezone.now() - ran.started_at).total_seconds() > SKEW - 60  # clock was behind
    assert not QueuedJob.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_lock_expiry_follows_the_store_clock_not_the_worker(workers, store_alias):
    store = get_store()
    assert store.acquire("chaos:held", "holder", ttl=30) is not None
    assert store.acquire("chaos:short", "holder", ttl=0.5) is not None
    wait_for(lambda: store.get_lock("chaos:short") is None)  # expired by the store's clock
    dispatch_many([chaos_jobs.TakeLock("chaos:held", 30), chaos_jobs.TakeLock("chaos:new", 30)])
    _run_once(workers, SKEW)  # 5 minutes ahead: "chaos:held" looks long expired to it
    outcome = dict(JobRun.objects.values_list("key", "label"))
    assert outcome["chaos:held"] == "refused"
    assert outcome["chaos:new"] == "acquired"
    assert store.get_lock("chaos:held").owner == "holder"
    expires = store.get_lock("chaos:new").expires_at
    expected = store.now() + datetime.timedelta(seconds=30)
    assert abs((expires - expected).total_seconds()) < 15  # not 5 minutes later

    chaos_jobs.TakeLock("chaos:short", 30).dispatch()
    _run_once(workers, -SKEW)  # 5 minutes behind: "chaos:short" still looks alive to it
    assert JobRun.objects.get(key="chaos:short").label == "acquired"


@pytest.mark.django_db
def test_idle_wait_for_a_delayed_job_uses_the_database_clock(monkeypatch):
    """A fast clock must not make an idle worker think the next job is already due (it would
    poll in a tight loop until it is)."""
    jobs.Record("later").dispatch(delay=60)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + datetime.timedelta(seconds=SKEW))
    worker = Worker(WorkerOptions(queues=["default"], sleep=120))
    assert 30 < worker.seconds_until_next_due() <= 61
