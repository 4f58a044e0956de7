"""Locks across real processes on the real test database, on both stores: dispatch storms,
overlapping workers, shared keys, killed workers, fencing tokens."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict

import pytest
from demo.models import Invoice, JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob, Worker
from django_jobguard.stores import get_store
from django_jobguard.unique_jobs import lock_key
from tests.support import POSTGRES, ROOT, run_command, wait_for, worker_env
from tests.support.lock_jobs import (
    OtherWaitForPartner,
    Overlap,
    UniqueFor,
    UniqueOnce,
    UniqueRecord,
    WaitForPartner,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def run_scripts(mode: str, processes: int, count: int, tmp_path) -> list[dict]:
    """Start ``processes`` copies of tests/lock_script.py, release them at once, collect."""
    go = tmp_path / "go"
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "testproject"), env["PYTHONPATH"]])
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.lock_script", mode, str(count),
                               str(go)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read()
        go.touch()  # everyone starts now
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_1000_dispatches_from_8_processes_queue_exactly_one(store_alias, tmp_path):
    results = run_scripts("dispatch", 8, 125, tmp_path)
    assert sum(r["queued"] for r in results) == 1
    assert sum(r["skipped"] for r in results) == 999
    row = QueuedJob.objects.get()
    assert get_store().get_lock(lock_key(UniqueRecord("storm"))).owner == str(row.id)


def test_rolled_back_dispatches_never_block_or_duplicate_a_unique_job(store_alias, tmp_path):
    """8 processes dispatch one unique job in transactions that mostly roll back: a lock left
    by a rollback never blocks the next dispatch (Redis cannot roll it back: it is taken over),
    and a dispatch whose transaction is still open is waited for, never duplicated."""
    results = run_scripts("rollback", processes=8, count=40, tmp_path=tmp_path)
    assert sum(r["rolled_back"] for r in results) > 0
    # None anywhere: on MariaDB/MySQL the lock row goes in with INSERT … ON DUPLICATE KEY
    # UPDATE, which waiters queue behind (a plain INSERT's waiters deadlocked, error 1213).
    assert sum(r["deadlocks"] for r in results) == 0
    assert sum(r["committed"] for r in results) == 1
    assert QueuedJob.objects.count() == 1
    assert get_store().get_lock(lock_key(UniqueRecord("storm"))).owner == str(
        QueuedJob.objects.get().id)


def test_fencing_tokens_are_unique_and_increase_under_contention(store_alias, tmp_path):
    results = run_scripts("fence", 4, 50, tmp_path)
    every = [token for r in results for token in r["tokens"]]
    assert len(every) == 200 and len(set(every)) == 200  # no two holders shared a token
    for r in results:  # each process saw its own tokens go up
        assert all(b > a for a, b in zip(r["tokens"], r["tokens"][1:], strict=False))


def test_no_two_jobs_on_one_overlap_key_ever_run_at_once(store_alias, workers, tmp_path):
    total, processes = (2000, 8) if POSTGRES else (400, 4)
    keys = [f"k{n}" for n in range(20)]
    # The jobs wait at a gate until two workers run one: the first worker up could drain the
    # queue alone while the others still start on a loaded machine (spread was a hope).
    gate = tmp_path / "gate"
    dispatch_many([Overlap(keys[i % 20], label="storm", seconds=0.002, expire_after=60,
                           gate=str(gate)) for i in range(total)])
    pool = workers(processes, "--stop-when-empty", "--sleep", "0.1")
    wait_for(lambda: len(set(JobRun.objects.filter(label="storm").values_list("pid", flat=True)))
             >= 2, timeout=120, what="two workers running jobs")
    gate.touch()
    pool.wait(600)
    runs = list(JobRun.objects.filter(label="storm").values("key", "job_id", "started_at",
                                                             "ended_at", "token", "pid"))
    assert len(runs) == total
    assert len({r["job_id"] for r in runs}) == total  # each job ran exactly once
    assert len({r["pid"] for r in runs}) > 1  # the work really was spread over processes
    by_key = defaultdict(list)
    for run in runs:
        by_key[run["key"]].append(run)
    assert sorted(by_key) == sorted(keys)
    for key, key_runs in by_key.items():
        key_runs.sort(key=lambda r: r["started_at"])
        for before, after in zip(key_runs, key_runs[1:], strict=False):
            assert after["started_at"] >= before["ended_at"], (key, before, after)
            assert after["token"] > before["token"], (key, before, after)
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert get_store().locks() == []


@pytest.mark.parametrize("shared", [True, False])
def test_shared_key_excludes_two_job_classes_and_plain_keys_let_them_overlap(
        store_alias, workers, shared):
    wait = 30.0  # shared: the first one waits until its partner was deferred
    WaitForPartner("inv-9", label="charge", partner="refund", wait=wait,
                   shared=shared).dispatch()
    OtherWaitForPartner("inv-9", label="refund", partner="charge", wait=wait,
                        shared=shared).dispatch()
    workers(2, "--stop-when-empty", "--sleep", "0.1").wait(120)
    charge, refund = (JobRun.objects.get(label=label) for label in ("charge", "refund"))
    first, second = sorted([charge, refund], key=lambda r: r.started_at)
    if shared:
        assert second.started_at >= first.ended_at  # one after the other
        assert first.key == "alone"
        assert JobRun.objects.filter(label="released:overlap").exists()  # second was deferred
    else:
        assert second.started_at < first.ended_at  # side by side
        assert charge.key == refund.key == "saw-partner"


def _kill(pool) -> None:
    proc = pool.procs[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()  # reaped: its pid is gone
    proc.stdout.close()


def test_killed_holder_blocks_only_until_expire_after(store_alias, workers):
    key = "jobguard:overlap:tests.support.lock_jobs.Overlap:inv-1"
    Overlap("inv-1", label="hold", seconds=30, expire_after=2).dispatch()
    holder = workers(1, "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(label="hold").exists(), timeout=60)
    held = get_store().get_lock(key)
    assert held.expires_at is not None
    _kill(holder)
    Overlap("inv-1", label="after", expire_after=2, release_after=0.2).dispatch()
    second = workers(1, "--sleep", "0.1")
    after = wait_for(lambda: JobRun.objects.filter(label="after", ended_at__isnull=False)
                     .first(), timeout=60)
    second.procs[0].send_signal(signal.SIGTERM)
    second.wait(30)
    hold = JobRun.objects.get(label="hold")
    assert hold.ended_at is None  # it really died holding the lock
    assert after.token > hold.token
    assert after.started_at >= held.expires_at - datetime.timedelta(seconds=0.1)


def test_killed_holder_without_expiry_blocks_until_force_release(store_alias, workers):
    key = "jobguard:overlap:tests.support.lock_jobs.Overlap:inv-2"
    Overlap("inv-2", label="hold", seconds=30, expire_after=0).dispatch()
    holder = workers(1, "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(label="hold").exists(), timeout=60)
    _kill(holder)
    Overlap("inv-2", label="after", expire_after=0, release_after=0.2).dispatch()
    second = workers(1, "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(label="released:overlap", key="inv-2").count() >= 3,
             timeout=60)
    assert not JobRun.objects.filter(label="after").exists()  # blocked
    listing = run_command("jobs_locks")
    assert listing.returncode == 0, listing.stderr
    line = next(x for x in listing.stdout.splitlines() if key in x)
    assert "never" in line and "STALE: worker" in line and "is gone" in line
    released = run_command("jobs_locks", "--release", key)
    assert released.returncode == 0 and f"Released {key}." in released.stdout
    wait_for(lambda: JobRun.objects.filter(label="after", ended_at__isnull=False).exists(),
             timeout=60)
    second.procs[0].send_signal(signal.SIGTERM)
    second.wait(30)


def test_crashed_unique_job_keeps_its_lock_until_unique_for(store_alias, workers):
    store = get_store()
    handle = UniqueFor("crash", seconds=30).dispatch()
    key = lock_key(UniqueFor("crash"))
    expires_at = store.get_lock(key).expires_at
    pool = workers(1, "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(job_id=handle.id).exists(), timeout=60)
    _kill(pool)
    if store.get_lock(key) is not None:  # not yet at unique_for: still unique
        assert not UniqueFor("crash").dispatch()
    again = wait_for(lambda: UniqueFor("crash").dispatch(), timeout=30)
    assert store.now() >= expires_at
    assert store.get_lock(key).owner == again.id


def test_crashed_unique_job_without_ttl_is_freed_when_recovery_fails_it(store_alias, workers):
    env = worker_env(JOBGUARD_RETRY_AFTER="2", JOBGUARD_DEFAULT_TIMEOUT="1")
    UniqueOnce("crash", seconds=30).dispatch()
    pool = workers(1, "--sleep", "0.1", "--timeout", "0", env=env)
    wait_for(lambda: JobRun.objects.filter(label="unique").exists(), timeout=60)
    _kill(pool)
    assert not UniqueOnce("crash").dispatch()  # no ttl: held while the job may come back
    recovery = workers(1, "--sleep", "0.1", env=env)
    wait_for(lambda: FailedJob.objects.exists(), timeout=60)  # lease ran out, tries used
    recovery.procs[0].send_signal(signal.SIGTERM)
    recovery.wait(30)
    assert FailedJob.objects.get().exception_class.endswith("MaxAttemptsExceededError")
    assert UniqueOnce("crash").dispatch()


def test_demo_charge_and_refund_of_one_invoice_never_overlap(store_alias, workers):
    from demo.jobs import ChargeInvoice, RefundInvoice

    invoice = Invoice.objects.create(number="INV-1")
    ChargeInvoice(invoice.pk, gateway_seconds=0.5).dispatch()
    RefundInvoice(invoice.pk, gateway_seconds=0.5).dispatch()
    pool = workers(2, "--sleep", "0.1")  # not --stop-when-empty: the deferred one waits 1 s
    wait_for(lambda: not QueuedJob.objects.exists(), timeout=60)
    # One worker may have run both jobs while the other was still starting (a loaded machine):
    # a SIGTERM during Django's start-up ends a process with -15. A worker's row is written
    # once its signal handlers are set, so both are stopped only after both rows exist.
    wait_for(lambda: Worker.objects.count() == 2, timeout=60, what="both workers up")
    for proc in pool.procs:
        proc.send_signal(signal.SIGTERM)
    pool.wait(30)
    invoice.refresh_from_db()
    # Both read-modify-write the whole row: side by side, one update would be lost.
    assert (invoice.charged, invoice.refunded) == (1, 1)
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
