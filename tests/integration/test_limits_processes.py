"""Limits across real worker processes, on both stores: the sliding window's guarantee, atomic
counters, and the circuit's single probe.

Clocks: a rate-limited job records the store time at which it was admitted (``JobRun.token``,
from the database clock or Redis ``TIME``); circuit deadlines are store time too. Workers
record ``started_at`` with ``time.time()``. All run on this machine, so the clocks agree to
well under the margins used here; the window guarantee is checked on the admission times
themselves, which is what the algorithm promises (a start is recorded a moment later).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from demo.models import JobRun, Profile

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from tests.support import MANAGE, ROOT, limit_jobs, wait_for, work, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WINDOW_US = 2_000_000


def stop(pool) -> list[str]:
    """SIGTERM every worker (they finish the current job) and collect their output."""
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    return pool.wait(60)


def most_in_any_window(times_us: list[int], window_us: int) -> int:
    """The largest number of ``times_us`` inside one half-open window ``[t, t + window)``."""
    times = sorted(times_us)
    best, j = 0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + window_us:
            j += 1
        best = max(best, j - i)
    return best


def test_most_in_any_window_helper():
    assert most_in_any_window([0, 1, 2, 3], 2) == 2
    assert most_in_any_window([0, 2, 4], 2) == 1  # half-open: 2 is not in [0, 2)
    assert most_in_any_window([0, 0, 0, 5], 10) == 4


def test_no_two_second_window_holds_more_than_five_starts(store_alias, workers):
    """4 workers, 5 starts per 2 s on one key, 40 jobs: the limit holds in every window, every
    job runs once, and none used up its single try on deferrals."""
    dispatch_many([limit_jobs.RateRecord("window", key="one") for _ in range(40)])
    pool = workers(4, "--sleep", "0.2")
    wait_for(lambda: JobRun.objects.filter(label="window").count() == 40, timeout=150)
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=30)
    outputs = stop(pool)

    runs = list(JobRun.objects.filter(label="window").values("job_id", "token", "started_at",
                                                             "attempt", "pid"))
    assert len({r["job_id"] for r in runs}) == 40  # each job ran exactly once
    admitted = [r["token"] for r in runs]
    assert most_in_any_window(admitted, WINDOW_US) == 5  # the limit, and all of it was used
    assert all(r["attempt"] == 1 for r in runs)  # tries=1: deferrals did not use it up
    assert not FailedJob.objects.exists()
    assert sum(out.count("rate_limited") for out in outputs) >= 35 - 5
    assert len({r["pid"] for r in runs}) > 1  # several processes shared the limit
    for r in runs:  # a job starts after its admission (same machine, same clock source)
        assert r["started_at"].timestamp() * 1_000_000 >= r["token"] - 50_000


def _python(code: str, env) -> subprocess.Popen:
    """``manage.py shell -c code`` against the test database and store."""
    return subprocess.Popen([sys.executable, str(MANAGE), "shell", "-c", textwrap.dedent(code)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_counters_are_atomic_across_processes(store_alias, transactional_db):
    """Four processes hit one window 40 times each as fast as they can: exactly the limit is
    admitted. Then, with the circuit open and expired, each asks to probe: exactly one may."""
    env = worker_env()
    hammer = """
        from django_jobguard.stores import get_store
        from django_jobguard.stores.base import RateWindow
        store = get_store()
        window = [RateWindow("jobguard:rate:atomic:60s", 25, 60)]
        print(sum(store.hit_rate_limits(window).allowed for _ in range(40)))
    """
    procs = [_python(hammer, env) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum(int(out.strip().splitlines()[-1]) for out in outs) == 25
    (info,) = get_store().throttles("jobguard:rate:atomic")
    assert info.hits == 25

    store = get_store()
    key = "jobguard:circuit:atomic"
    for _ in range(3):
        store.circuit_leave(key, owner="x", outcome="failure", max_attempts=3, decay=0.5)
    wait_for(lambda: store.throttles(key)[0].state == "half-open", timeout=10)
    probe = f"""
        import os
        from django_jobguard.stores import get_store
        store = get_store()
        seen = [store.circuit_enter({key!r}, owner=str(os.getpid()), max_attempts=3, decay=0.5,
                                    probe_lease=60).probe for _ in range(20)]
        print(sum(seen))
    """
    procs = [_python(probe, env) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    # The probe's owner asking again renews its own probe; nobody else gets one.
    winners = [int(out.strip().splitlines()[-1]) for out in outs]
    assert sorted(w > 0 for w in winners) == [False, False, False, True], outs


def test_circuit_opens_holds_other_classes_and_lets_one_probe_through(store_alias, workers):
    """The SMS outage: five failures open the shared circuit; another job class on the same
    ``by`` key is held; after the decay one probe runs alone (it fails: reopened); after the
    next decay one probe runs alone again (it succeeds: closed and reset); then all run."""
    Profile.objects.create(name="gateway", syncs=0)  # down
    dispatch_many([limit_jobs.GatewayA(f"a{i}", seconds=0.2) for i in range(5)])
    workers(1, "--stop-when-empty", "--sleep", "0").wait(60)  # one worker: exactly 5 failures
    (opened,) = get_store().throttles("jobguard:circuit:gateway")
    assert (opened.state, opened.hits, opened.limit) == ("open", 5, 5)
    assert JobRun.objects.filter(key="fail").count() == 5

    dispatch_many([limit_jobs.GatewayB(f"b{i}", seconds=0.3) for i in range(3)])
    assert sorted(work()) == ["RELEASED"] * 3  # held while open, here in the test process too
    assert not JobRun.objects.filter(label__startswith="b").exists()

    pool = workers(3, "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(key="fail").count() == 6, timeout=60)
    reopened = wait_for(lambda: next(iter(t for t in get_store().throttles("jobguard:circuit:")
                                          if t.state == "open"), None), timeout=30)
    Profile.objects.filter(name="gateway").update(syncs=1)  # the gateway is back
    wait_for(lambda: JobRun.objects.filter(key="ok").count() == 8, timeout=60)
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=30)
    stop(pool)

    runs = list(JobRun.objects.order_by("started_at"))
    first_probe = runs[5]
    assert first_probe.key == "fail"
    open_until = opened.resets_at
    assert first_probe.started_at >= open_until  # nothing ran while it was open
    second_probe = runs[6]
    assert second_probe.key == "ok" and second_probe.started_at >= reopened.resets_at
    # Each probe ran alone: the next run began only after the probe had finished.
    assert runs[6].started_at >= first_probe.ended_at
    assert runs[7].started_at >= second_probe.ended_at
    assert {r.label[0] for r in runs[6:]} == {"a", "b"}  # both classes ran once closed
    assert get_store().throttles("jobguard:circuit:gateway") == []  # success reset it
    assert not FailedJob.objects.exists()
