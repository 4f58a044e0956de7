"""Batches on real worker processes (issue 15): with 4 workers finishing the members of 30
small batches, the last two members of a batch often finish at the same instant on two
workers; each batch's callbacks still run exactly once, and every count adds up."""

from __future__ import annotations

from collections import Counter

import pytest
from demo.models import JobRun

from django_jobguard import batch
from django_jobguard.models import Batch, QueuedJob
from tests.support import wait_for, worker_env
from tests.support.flow_jobs import CallbackRecord, Flaky, Step

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_callbacks_run_exactly_once_per_batch_with_four_workers(workers):
    batches = []
    for n in range(30):
        members = [Step(f"m{n}-{i}") for i in range(6)]
        if n % 5 == 4:  # some batches have a failure (failures allowed)
            members.append(Flaky("bad"))
        pending = batch(members, name=f"b{n}").then(CallbackRecord(f"then-{n}")).finally_(
            CallbackRecord(f"finally-{n}")).catch(CallbackRecord(f"catch-{n}"))
        batches.append(pending.allow_failures().dispatch())
    env = worker_env(JOBGUARD_EXTRA_JOB_MODULES="tests.support.flow_jobs")
    env["FLOW_FAILING"] = "bad"
    workers(4, "--sleep", "0.05", "--stop-when-empty", env=env).wait(180)

    assert not QueuedJob.objects.exists()
    runs = Counter(JobRun.objects.values_list("label", flat=True))
    for n, row in enumerate(batches):
        row = Batch.objects.get(id=row.id)
        failing = n % 5 == 4
        assert row.finished and row.status == ("failed" if failing else "completed")
        assert (row.total_jobs, row.failed_jobs) == (7 if failing else 6, int(failing))
        assert runs[f"finally-{n}"] == 1, f"batch {n}: finally ran {runs[f'finally-{n}']}x"
        assert runs[f"then-{n}"] == (0 if failing else 1)
        assert runs[f"catch-{n}"] == int(failing)
        assert all(runs[f"m{n}-{i}"] == 1 for i in range(6))
    # The callback saw its batch's final counts (total/pending/failed).
    assert JobRun.objects.get(label="then-0").key == "6/0/0"


@pytest.mark.parametrize("mode", ["processes", "threads", "async"])
def test_no_member_starts_after_cancel_returns(workers, mode, tmp_path):
    """Issue 27 (6): cancel a batch while two workers run through its members; no member
    that had not started when ``cancel()`` returned ever runs. A member starts when its
    attempt is counted (in the claim, or later for one claimed ahead), so the members with
    ``attempts = 0`` just after the cancel are the ones that must never run."""
    from tests.support.async_jobs import AsyncRecord

    # The members that started wait at a gate until the cancel has been looked at, so most of
    # the 600 have not started then however fast or slow the machine is (20 ms each, and no
    # gate, let a stalled test process see every member started: CI of 2026-12-07).
    gate = str(tmp_path / "gate")
    members = [AsyncRecord(f"c{i}", seconds=0.02, gate=gate) if mode == "async"
               else Step(f"c{i}", first_run_seconds=0.02, gate=gate) for i in range(600)]
    handle = batch(members, name="cancelled").dispatch()
    args = {"processes": ("--batch", "20"), "threads": ("--threads", "4"),
            "async": ("--async-concurrency", "8")}[mode]
    env = worker_env(JOBGUARD_EXTRA_JOB_MODULES="tests.support.flow_jobs")
    pool = workers(2, "--sleep", "0.05", "--stop-when-empty", *args, env=env)
    wait_for(lambda: JobRun.objects.count() >= 2, timeout=120, what="members running")

    assert handle.cancel()
    not_started = set(QueuedJob.objects.filter(id__in=handle.job_ids, attempts=0)
                      .values_list("id", flat=True))
    open(gate, "w").close()
    # At most the claimed ones (2 workers x (a batch of 20 + 20 claimed ahead)) had started.
    assert len(not_started) >= 600 - 80, f"only {len(not_started)} members not started"
    pool.wait(180)

    ran = set(JobRun.objects.values_list("job_id", flat=True))
    started_late = {str(i) for i in not_started} & ran
    assert not started_late, f"{len(started_late)} of {len(not_started)} members not started " \
                             f"at the cancel ran after it"
    assert not QueuedJob.objects.exists()
    row = Batch.objects.get(id=handle.id)
    assert row.cancelled_at is not None and row.finished and row.pending_jobs == 0
