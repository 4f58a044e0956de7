"""Periodic jobs with real worker processes: every worker runs the scheduler, and each tick
is enqueued, and run, exactly once."""

from __future__ import annotations

import datetime

import pytest
from demo.models import JobRun

from django_jobguard.dialects import dialect_for
from django_jobguard.models import QueuedJob, ScheduleTick
from tests.support import wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MINUTE = datetime.timedelta(minutes=1)


def test_three_workers_enqueue_every_missed_tick_once(workers):
    now = dialect_for("default").now()
    this_minute = now.replace(second=0, microsecond=0)
    seed = this_minute - 30 * MINUTE  # the last tick recorded before "the outage"
    ScheduleTick.objects.create(schedule="race-all", tick=seed)
    ScheduleTick.objects.create(schedule="race-last", tick=seed)

    # RETRY_AFTER 3: a heartbeat, and so a scheduler pass, every second
    env = worker_env(JOBGUARD_EXTRA_JOB_MODULES="tests.support.schedule_jobs",
                     JOBGUARD_RETRY_AFTER="3", JOBGUARD_DEFAULT_TIMEOUT="2")
    pool = workers(3, "--sleep", "0.2", "--max-time", "12", env=env)
    # 30 missed ticks of "race-all" and the newest one of "race-last" are queued and run.
    wait_for(lambda: JobRun.objects.filter(label="race-all").count() >= 30
             and JobRun.objects.filter(label="race-last").exists(), timeout=60)
    pool.wait(60)

    all_ticks = list(ScheduleTick.objects.filter(schedule="race-all", tick__gt=seed)
                     .order_by("tick"))
    # each minute once, no gaps (the last may be the next minute if it began meanwhile)
    assert [t.tick for t in all_ticks][:30] == [seed + i * MINUTE for i in range(1, 31)]
    assert [t.tick for t in all_ticks] == [seed + i * MINUTE
                                           for i in range(1, len(all_ticks) + 1)]
    assert len(all_ticks) in (30, 31)
    job_ids = [t.job_id for t in all_ticks]
    assert all(job_ids) and len(set(job_ids)) == len(job_ids)
    runs = list(JobRun.objects.filter(label="race-all").values_list("job_id", flat=True))
    assert sorted(runs) == sorted(job_ids)  # every tick's job ran, once

    last_ticks = [t.tick for t in ScheduleTick.objects.filter(
        schedule="race-last", tick__gt=seed).order_by("tick")]
    # catch_up="last" queues the newest tick due at the first pass: this minute's, or the
    # next one's when the workers' first pass came after it began (a loaded machine).
    assert last_ticks in ([this_minute], [this_minute, this_minute + MINUTE],
                          [this_minute + MINUTE])
    assert JobRun.objects.filter(label="race-last").count() == len(last_ticks)
    assert not QueuedJob.objects.exists()
