"""Restart Redis while worker processes run jobs whose locks live in the Redis store.

Each test starts its OWN redis-server on a free port, with its data in the test's temporary
directory, and restarts only that one, so it never touches the Redis other test runs use; the
tests still only run where JOBGUARD_CHAOS_REDIS_RESTART=1 (``.ci/run`` sets it).

- Unique jobs, Redis without persistence (``shutdown nosave``). While Redis is down a worker
  that finishes a job cannot release its unique lock: the job is already acked, so the worker
  logs it and goes on (the restart forgot the lock anyway). Afterwards every job has run,
  nothing is failed or left queued, and the same unique keys can be dispatched again.
- Overlap locks (``WithoutOverlapping``), Redis with an append-only file synced before every
  reply (``appendfsync always``), killed with SIGKILL and started again: every acknowledged
  lock comes back with it, so the runs of one key never overlap, across the restart too.
- Overlap locks, Redis without persistence (``shutdown nosave``): the locks are forgotten, so
  a second run of a key can start while the first still runs; but the fencing tokens handed
  out after the restart are all larger than those handed out before it (the counter never
  goes below the server time in microseconds), so a write fenced by the token refuses the
  older holder.

In both overlap tests jobs keep being dispatched while Redis is down. A worker that cannot
reach Redis to take a job's lock puts the job back without using an attempt (the jobs have
one try) and logs it; no job is lost or failed, and no worker dies.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from demo.models import JobRun
from django.db import transaction
from django.utils import timezone

from django_jobguard import dispatch_many
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import LockInfo, get_store
from tests.chaos import jobs as chaos_jobs
from tests.chaos.conftest import Outcome, PrivateRedis, chaos_env
from tests.support import wait_for

pytestmark = [
    pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.environ.get("JOBGUARD_CHAOS_REDIS_RESTART") != "1",
                       reason="restarts a redis-server: set JOBGUARD_CHAOS_REDIS_RESTART=1"),
    pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server"),
]


def test_redis_restart_loses_no_job_and_leaves_no_stale_lock(fleet, private_redis, tmp_path):
    total = 300
    # The second half waits at a gate opened once Redis is down: some jobs are left to run
    # without it however slow the test process (300 jobs of 10 ms could all end first).
    gate = tmp_path / "gate"
    handles = dispatch_many([chaos_jobs.UniqueRecord(str(i), str(gate) if i >= total // 2
                                                     else "") for i in range(total)])
    assert all(handles)
    workers = fleet("--sleep", "0.2", env=chaos_env(JOBGUARD_REDIS_URL=private_redis.url,
                                                    JOBGUARD_STORE="redis"))
    procs = workers.start(2)
    private_redis.restart_midway("unique", total, finished_meanwhile=10, gate=gate)
    assert_unique_jobs_outlived_the_restart(workers, procs, handles, "unique")
    # no lock outlived its job: every key can be dispatched again
    again = dispatch_many([chaos_jobs.UniqueRecord(str(i)) for i in range(total)])
    assert all(again)


def assert_unique_jobs_outlived_the_restart(workers, procs, handles, label: str) -> None:
    """After a Redis restart under unique jobs: every job ran, none failed or stayed queued,
    no worker died, and the releases that met Redis down were logged."""
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=120)
    assert all(p.poll() is None for p in procs)  # no worker died
    assert all(code == 0 for code in workers.stop_all())
    assert "Could not release unique lock" in workers.errors()
    out = Outcome.read((h.id for h in handles), label)
    assert out.queued == 0 and not FailedJob.objects.exists()
    assert out.completed == out.ids


# -- overlap locks across a restart ------------------------------------------------------------

KEYS = ["k0", "k1", "k2", "k3"]
HELD = "held"  # the key whose lock is held across the restart
HELD_LOCK = f"jobguard:overlap:{chaos_jobs.OverlapRecord.name}:{HELD}"
OUTAGE_LOGGED = "without using an attempt"  # the worker's warning when it puts a job back


def _overlap_env(server: PrivateRedis) -> dict[str, str]:
    """Workers on ``server``. Nothing is killed here, so the lease is long (the 2 s of
    CHAOS_ENV can run out on a loaded 2-core machine and hand a running job to a second
    worker), and the timeout is above the time the held job waits for the test."""
    return chaos_env(JOBGUARD_RETRY_AFTER="70", JOBGUARD_DEFAULT_TIMEOUT="60",
                     JOBGUARD_STORE="redis", JOBGUARD_REDIS_URL=server.url)


def _current_lock(key: str) -> LockInfo | None:
    """The holder of ``key`` in the Redis store, asking until Redis answers."""
    def ask():
        try:
            return (get_store().get_lock(key),)
        except StoreUnavailableError:
            return None

    return wait_for(ask, timeout=20)[0]


def _run_of(job_id: str, *, ended: bool = False) -> JobRun | None:
    runs = JobRun.objects.filter(label="overlap", job_id=job_id)
    return runs.filter(ended_at__isnull=False).first() if ended else runs.first()


@dataclass
class RestartRun:
    """What the overlap jobs recorded around one restart of Redis."""

    runs: list[JobRun]  # label "overlap", in start order
    refused: list[JobRun]  # fenced writes that were refused
    fence: dict[str, int]  # the last token each key's fence took
    holder: JobRun  # the run that held HELD across the restart
    late: JobRun  # the run of HELD dispatched after the restart
    dispatched: set[str]
    dispatched_while_down: set[str]  # jobs dispatched after Redis was stopped
    down_at: datetime.datetime  # just before Redis was stopped

    def by_key(self) -> dict[str, list[JobRun]]:
        out: dict[str, list[JobRun]] = defaultdict(list)
        for run in self.runs:
            out[run.key].append(run)
        return out


def _restart_under_overlap_load(fleet, server: PrivateRedis, *, stop: Callable[[], None],
                                lock_survives: bool) -> RestartRun:
    """Three workers run overlap jobs on KEYS while a job holds HELD's lock; ``stop`` Redis
    midway, dispatch more jobs while it is down, start it again, dispatch one more job on
    HELD, let the holder finish, and wait until the queue is empty."""
    for key in [*KEYS, HELD]:
        JobRun.objects.create(label="fence", key=key, token=0, started_at=timezone.now())
    holder = chaos_jobs.OverlapRecord(HELD, hold=True, expire_after=120).dispatch(priority=10)
    early = dispatch_many([chaos_jobs.OverlapRecord(key) for _ in range(12) for key in KEYS])
    workers = fleet("--sleep", "0.2", env=_overlap_env(server))
    procs = workers.start(3)
    wait_for(lambda: _run_of(holder.id), timeout=60)
    wait_for(lambda: JobRun.objects.filter(label="overlap", key__in=KEYS,
                                           ended_at__isnull=False).count() >= 24, timeout=120)
    held = _current_lock(HELD_LOCK)
    assert held is not None and held.token == _run_of(holder.id).token

    down_at = timezone.now()
    stop()
    # Jobs dispatched now can only get their locks from the restarted Redis.
    while_down = dispatch_many([chaos_jobs.OverlapRecord(key) for _ in range(8) for key in KEYS])
    wait_for(lambda: OUTAGE_LOGGED in workers.errors() or FailedJob.objects.exists(),
             timeout=60)
    assert not FailedJob.objects.exists(), "the outage used up a job's only try"
    server.start()

    after = _current_lock(HELD_LOCK)
    if lock_survives:
        assert after is not None and (after.owner, after.token) == (held.owner, held.token)
    else:
        assert after is None  # forgotten, although its holder is still running
    with transaction.atomic():  # no worker sees the row before we have read it
        late = chaos_jobs.OverlapRecord(HELD).dispatch(priority=10)
        dispatched_at = QueuedJob.objects.get(id=late.id).available_at
    if lock_survives:
        # Wait until a worker took it and was refused the lock (or, had the lock not held,
        # ran it): either way the row has moved on from how it was dispatched.
        def tried() -> bool:
            row = QueuedJob.objects.filter(id=late.id).first()
            return row is None or (row.reserved_by == "" and row.available_at > dispatched_at)

        wait_for(tried, timeout=60)
    else:
        wait_for(lambda: _run_of(late.id, ended=True), timeout=60)  # beside the holder
    JobRun.objects.create(label="go", key=HELD, started_at=timezone.now())

    wait_for(lambda: not QueuedJob.objects.exists(), timeout=180)
    assert all(p.poll() is None for p in procs)  # no worker died
    assert all(code == 0 for code in workers.stop_all())
    assert OUTAGE_LOGGED in workers.errors()

    handles = [holder, *early, *while_down, late]
    assert all(handles)
    return RestartRun(
        runs=list(JobRun.objects.filter(label="overlap").order_by("started_at", "id")),
        refused=list(JobRun.objects.filter(label="fence-refused")),
        fence=dict(JobRun.objects.filter(label="fence").values_list("key", "token")),
        holder=_run_of(holder.id), late=_run_of(late.id),
        dispatched={h.id for h in handles},
        dispatched_while_down={h.id for h in [*while_down, late]},
        down_at=down_at)


def _assert_no_job_lost_and_tokens_rise(out: RestartRun) -> None:
    """What holds with and without persistence."""
    assert not FailedJob.objects.exists() and not QueuedJob.objects.exists()
    # every job ran exactly once, to its end (one try each: no outage used it up)
    assert Counter(run.job_id for run in out.runs) == Counter(out.dispatched)
    assert all(run.ended_at is not None for run in out.runs)
    # per key, each run's token is larger than the one of the run started before it
    for key, runs in out.by_key().items():
        tokens = [run.token for run in runs]
        assert tokens == sorted(set(tokens)), key
    # every token handed out after the restart is larger than every token handed out before
    before = [r.token for r in out.runs if r.started_at < out.down_at]
    after = [r.token for r in out.runs if r.job_id in out.dispatched_while_down]
    assert before and after and min(after) > max(before)
    # a refused write was a stale holder's: the fence had already taken a larger token
    assert all(r.token < out.fence[r.key] for r in out.refused)


def test_overlap_locks_survive_a_redis_crash_with_appendfsync_always(fleet, aof_redis):
    out = _restart_under_overlap_load(fleet, aof_redis, stop=aof_redis.kill,
                                      lock_survives=True)
    _assert_no_job_lost_and_tokens_rise(out)
    for key, runs in out.by_key().items():  # never two runs of a key at once
        for earlier, later in zip(runs, runs[1:], strict=False):
            assert later.started_at >= earlier.ended_at, key
    # the job dispatched after the restart waited for the holder, which kept its lock
    assert out.late.started_at >= out.holder.ended_at
    assert out.late.token > out.holder.token
    assert out.refused == []  # so no write was ever stale


def test_without_persistence_locks_are_lost_but_fencing_refuses_the_older_holder(
        fleet, private_redis):
    out = _restart_under_overlap_load(fleet, private_redis, stop=private_redis.shutdown,
                                      lock_survives=False)
    _assert_no_job_lost_and_tokens_rise(out)
    # the restart forgot the holder's lock: the late run ran while the holder still ran ...
    assert out.late.started_at < out.late.ended_at < out.holder.ended_at
    assert out.holder.started_at < out.late.started_at
    # ... with a larger token, so the fence took the late run's write and refused the
    # holder's, which came after it
    assert out.late.token > out.holder.token
    assert out.fence[HELD] == out.late.token
    assert [(r.job_id, r.token) for r in out.refused if r.key == HELD] == [
        (out.holder.job_id, out.holder.token)]
