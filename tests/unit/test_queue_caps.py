"""``JOBGUARD["QUEUES"][name]["global_concurrency"]``: claims of a capped queue stop at the
cap, counting every reserved row with a live lease (rows claimed ahead too)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_jobguard import dispatch_many, queue
from django_jobguard.models import QueuedJob, QueueGate
from tests.support import jobs

pytestmark = pytest.mark.django_db

CAPPED = {"QUEUES": {"reports": {"global_concurrency": 2}}}


def test_claims_of_a_capped_queue_stop_at_its_cap_and_resume_as_jobs_end():
    dispatch_many([jobs.Noop(n) for n in range(5)], queue="reports")
    with override_settings(JOBGUARD=CAPPED):
        first = queue.claim(["reports"], worker_id="w1", limit=5)
        assert len(first) == 2
        assert queue.claim(["reports"], worker_id="w2", limit=5) == []
        assert queue.ack(first[0])
        (again,) = queue.claim(["reports"], worker_id="w2", limit=5)
        assert queue.release(again)  # back to the queue: no longer counted
        assert len(queue.claim(["reports"], worker_id="w3", limit=5)) == 1
    assert QueueGate.objects.filter(queue="reports").exists()


def test_rows_claimed_ahead_count_towards_the_cap():
    dispatch_many([jobs.Noop(n) for n in range(5)], queue="reports")
    with override_settings(JOBGUARD=CAPPED):
        rows = queue.claim(["reports"], worker_id="w1", limit=5, start=1)
        assert [row.attempt_counted for row in rows] == [True, False]
        assert queue.claim(["reports"], worker_id="w2", limit=5) == []


def test_an_expired_lease_no_longer_counts():
    dispatch_many([jobs.Noop(n) for n in range(3)], queue="reports")
    with override_settings(JOBGUARD=CAPPED):
        rows = queue.claim(["reports"], worker_id="dead", limit=5)
        QueuedJob.objects.filter(id__in=[r.id for r in rows]).update(
            available_at=QueuedJob.objects.get(id=rows[0].id).created_at)
        assert len(queue.claim(["reports"], worker_id="w2", limit=5)) == 2


def test_other_queues_are_not_capped():
    dispatch_many([jobs.Noop(n) for n in range(5)])
    with override_settings(JOBGUARD=CAPPED):
        assert len(queue.claim(["default"], worker_id="w1", limit=5)) == 5
    assert not QueueGate.objects.exists()


def test_a_capped_queue_gives_no_rows_to_a_prefetch():
    """A worker's prefetch (``ahead``: rows no slot waits for) takes nothing from a capped
    queue: a buffered row would hold a place of the cap an idle worker could use."""
    dispatch_many([jobs.Noop(n) for n in range(3)], queue="reports")
    dispatch_many([jobs.Noop(n) for n in range(3)])
    with override_settings(JOBGUARD={"QUEUES": {"reports": {"global_concurrency": 5}}}):
        assert queue.claim(["reports"], worker_id="w1", limit=2, ahead=2) == []
        assert len(queue.claim(["reports"], worker_id="w1", limit=3, ahead=2)) == 1
        # an uncapped queue is prefetched from
        assert len(queue.claim(["default"], worker_id="w1", limit=3, ahead=2)) == 3
