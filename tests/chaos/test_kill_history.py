"""kill -9 threaded workers while they work through a queue with ``HISTORY = "all"``.

What the finished-job history promises (docs/operate.md): a run is recorded at most once
(only the worker whose ack or fail succeeded records it, and a retried insert is ignored),
and every run acked by a worker that lived to its next heartbeat or its shutdown is recorded;
a worker killed with ``kill -9`` loses only the runs it acked since its last heartbeat.
"""

from __future__ import annotations

import pytest
from django.db.models import Sum

from django_jobguard import dispatch_many, history
from django_jobguard.models import FinishedRun, RunStatistic
from tests.chaos.conftest import LONG_LEASE, Outcome, chaos_env
from tests.support import POSTGRES, jobs

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def pid_of(worker_id: str) -> int:
    """The pid in a worker id (``host:pid:hex``)."""
    return int(worker_id.rsplit(":", 2)[-2])


def test_kill_9_threaded_workers_records_each_run_once_and_loses_only_the_killed_ones(fleet):
    total, kills = (400, 3) if POSTGRES else (120, 2)
    handles = dispatch_many([jobs.Record("history", key=str(i), seconds=0.01)
                             for i in range(total)])
    workers = fleet("--sleep", "0.2", "--tries", "5", "--threads", "3",
                    env=chaos_env(**LONG_LEASE, JOBGUARD_HISTORY="all"))
    workers.start(2)
    workers.kill_as_it_goes("history", total, kills)
    workers.finish()  # a graceful stop flushes what ran since the last heartbeat

    out = Outcome.read((h.id for h in handles), "history")
    assert out.queued == 0 and out.completed | set(out.failed) == out.ids
    recorded = list(FinishedRun.objects.values_list("job_id", "state", "worker", "attempt"))
    ids = [str(job_id) for job_id, *_ in recorded]
    assert len(ids) == len(set(ids)), "a run was recorded twice"
    assert set(ids) <= out.ids
    by_job = {str(job_id): (state, worker, attempt) for job_id, state, worker, attempt
              in recorded}
    missing = []
    for job_id in out.completed - set(out.failed):
        done = [r for r in out.runs[job_id] if r["ended_at"] is not None]
        acked_by = done[-1]  # an earlier completed run was never acked: its worker was killed
        if job_id in by_job:
            state, worker, attempt = by_job[job_id]
            assert state == "DONE" and pid_of(worker) == acked_by["pid"], (job_id, by_job[job_id],
                                                                          out.runs[job_id])
            assert attempt == acked_by["attempt"]
        else:
            missing.append(job_id)
            # Lost only with the buffer of a worker killed after the ack.
            assert acked_by["pid"] in workers.killed, (job_id, out.runs[job_id])
    for job_id in out.failed:  # failed for good (out of tries): FAILED if recorded
        assert by_job.get(job_id, ("FAILED",))[0] == "FAILED"
    survivors = {r["pid"] for runs in out.runs.values() for r in runs} - workers.killed
    assert any(pid_of(w) in survivors for _, _, w, _ in recorded)  # survivors did record
    assert len(workers.killed) == kills
    for span in history.SPANS:  # the statistics count the recorded runs, each once
        counted = RunStatistic.objects.filter(span=span, bucket=history.SUMMARY).aggregate(
            runs=Sum("runs"))["runs"]
        assert counted == len(recorded), span
