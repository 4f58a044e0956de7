"""kill -9 random workers while they work through a queue.

The guarantee under test (docs/guarantees.md): delivery is at-least-once with lease recovery.
A job's row is deleted (acked) only after ``handle()`` returned, so

- every job either completes at least once or lands in failed jobs with a reason;
- nothing stays queued or reserved once the leases (RETRY_AFTER) of the dead have run out;
- a run cut short, or a completed run followed by another, only ever happened in a worker
  that was killed (between ``handle()`` returning and its ack) — a surviving worker's
  completion is final and never repeated;
- each re-run counts as a new attempt.
"""

from __future__ import annotations

import pytest

from django_jobguard import dispatch_many
from tests.chaos.conftest import LONG_LEASE, Outcome, chaos_env
from tests.support import POSTGRES, jobs

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_kill_9_random_workers_loses_no_job(fleet):
    total, processes, kills = (1000, 4, 8) if POSTGRES else (200, 2, 3)
    handles = dispatch_many([jobs.Record("chaos", key=str(i), seconds=0.01)
                             for i in range(total)])
    workers = fleet("--sleep", "0.2", "--tries", "5", env=chaos_env(**LONG_LEASE))
    workers.start(processes)
    workers.kill_as_it_goes("chaos", total, kills)
    workers.finish()

    out = Outcome.read((h.id for h in handles), "chaos")
    assert out.queued == 0  # nothing lost in the queue, nothing left reserved
    assert out.completed | set(out.failed) == out.ids  # every job accounted for
    assert set(out.runs) <= out.ids
    for failed in out.failed.values():  # a failed job says why
        assert failed.exception_class.endswith("MaxAttemptsExceededError"), failed.message
        assert "attempted too many times" in failed.message
        assert all(r["pid"] in workers.killed for r in out.runs.get(str(failed.id), []))
    out.assert_only_kills_repeat(workers.killed)
    assert len(workers.killed) == kills
