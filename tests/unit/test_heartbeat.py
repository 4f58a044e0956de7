"""The worker's heartbeat (django_jobguard/worker/heartbeat.py): each named step, in-process."""

from __future__ import annotations

import datetime
from collections import deque

import pytest
from django.utils import timezone

from django_jobguard import queue
from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.worker import Worker, WorkerOptions
from django_jobguard.worker import heartbeat as heartbeat_module
from tests.support import jobs

pytestmark = pytest.mark.django_db


def _lease_out(*ids) -> None:
    """Make the leases of ``ids`` run out (as if the heartbeat had stopped long ago)."""
    QueuedJob.objects.filter(id__in=ids).update(
        available_at=timezone.now() - datetime.timedelta(seconds=1))


def test_renew_leases_renews_running_and_claimed_ahead_rows_and_no_other():
    handles = [jobs.Noop(n).dispatch() for n in range(3)]
    worker = Worker(WorkerOptions(queues=["default"], memory=0))
    running, ahead = queue.claim(["default"], worker_id=worker.id, limit=2, start=1)
    other = queue.claim(["default"], worker_id="someone-else")[0]
    worker.show_running([running])
    worker._waiting = deque([ahead])  # claimed ahead: started by the ack of the running one
    _lease_out(*(handle.id for handle in handles))

    assert worker._heartbeat.renew_leases() == (2, 2)
    assert set(QueuedJob.objects.reserved().values_list("id", flat=True)) == {
        running.id, ahead.id}
    assert not QueuedJob.objects.reserved().filter(id=other.id).exists()


def test_say_alive_writes_the_counts_of_the_worker_row():
    worker = Worker(WorkerOptions(queues=["default", "mail"], memory=0))
    WorkerRow.objects.create(id=worker.id, **worker.identity())
    worker.job_finished("DONE", "default")
    worker.job_finished("FAILED", "mail")

    worker._heartbeat.say_alive()
    row = WorkerRow.objects.get(id=worker.id)
    assert (row.jobs_processed, row.done_last_minute, row.failed_last_minute) == (2, 1, 1)


def test_housekeeping_runs_at_most_once_per_interval(monkeypatch):
    calls = []
    monkeypatch.setattr(heartbeat_module.operations, "housekeeping",
                        lambda using: calls.append(using))
    beat = Worker(WorkerOptions(queues=["default"], memory=0))._heartbeat

    beat.housekeeping()  # the worker just started: not yet
    assert calls == []
    beat.housekeeping(every=0)
    beat.housekeeping()  # it just ran
    assert calls == ["default"]


def test_a_beat_runs_every_step_in_turn(monkeypatch):
    beat = Worker(WorkerOptions(queues=["default"], memory=0))._heartbeat
    steps = []
    for name in ("renew_leases", "say_alive", "flush_history", "tick_schedules",
                 "housekeeping"):
        def step(*args, _name=name, **kwargs):
            steps.append(_name)
            return (0, 0)
        monkeypatch.setattr(beat, name, step)
    beat.beat()
    assert steps == ["renew_leases", "say_alive", "flush_history", "tick_schedules",
                     "housekeeping"]
