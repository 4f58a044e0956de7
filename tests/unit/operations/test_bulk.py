"""Bulk actions on every job a search matches, in bounded batches, and requeueing the
reservation of a worker that is gone."""

from __future__ import annotations

import logging
import socket
import subprocess

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard import get_store, operations, queue
from django_jobguard.dialects import dialect_for
from django_jobguard.models import FailedJob, QueuedJob, Worker
from django_jobguard.operations import JobSearch
from django_jobguard.worker.completer import Completer
from tests.support import requires_postgres
from tests.support.operate import UniqueReport, failed_job, reserved, waiting

pytestmark = pytest.mark.django_db


def failed_with(invoice_id, queue_name="default") -> FailedJob:
    row = failed_job(queue_name=queue_name)
    FailedJob.objects.filter(id=row.id).update(
        payload={"args": [], "kwargs": {"invoice_id": invoice_id}})
    return row


def test_retry_matching_retries_every_match_in_batches_and_logs_once(caplog):
    matching = [failed_with(7) for _ in range(7)]
    other = failed_with(8)
    rows = JobSearch.from_params({"kwargs__invoice_id": "7"}, failed=True).failed_jobs()
    with caplog.at_level(logging.WARNING, "django_jobguard.operations"), \
            CaptureQueriesContext(connection) as queries:
        result = operations.retry_matching(rows, actor="ann", description="kwargs__id = 7",
                                           batch_size=3)
    assert result == operations.BulkResult(done=7, skipped=0)
    assert set(QueuedJob.objects.values_list("id", flat=True)) == {r.id for r in matching}
    assert list(FailedJob.objects.values_list("id", flat=True)) == [other.id]
    # no statement names more than a batch of ids: 7 rows in 3 batches (+1 empty read)
    selects = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")
               and "ORDER BY" in q["sql"] and "LIMIT 3" in q["sql"].upper()]
    assert len(selects) == 4
    [line] = [r.getMessage() for r in caplog.records]
    assert line == "Retried 7 failed job(s) matching kwargs__id = 7 by ann."


def test_retry_matching_skips_a_failed_job_whose_id_is_queued_already():
    row = failed_with(7)
    QueuedJob.objects.create(id=row.id, name="x", payload={"args": [], "kwargs": {}})
    second = failed_with(7)
    result = operations.retry_matching(FailedJob.objects.all())
    assert result == operations.BulkResult(done=1, skipped=1)
    assert FailedJob.objects.get().id == row.id
    assert QueuedJob.objects.filter(id=second.id).exists()


def test_forget_matching_deletes_only_matches():
    for _ in range(5):
        failed_with(1, queue_name="billing")
    keep = failed_with(1, queue_name="default")
    rows = JobSearch.from_params({"queue": "billing"}, failed=True).failed_jobs()
    assert operations.forget_matching(rows, batch_size=2).done == 5
    assert list(FailedJob.objects.values_list("id", flat=True)) == [keep.id]


def test_delete_matching_skips_reserved_jobs_and_frees_unique_locks():
    UniqueReport(5).dispatch()
    unique_row = QueuedJob.objects.get(name=UniqueReport.name)
    plain = [waiting(queue_name="busy") for _ in range(3)]
    held = reserved(queue_name="busy2")
    result = operations.delete_matching(QueuedJob.objects.all(), actor="ann", batch_size=2)
    assert result == operations.BulkResult(done=4, skipped=1)
    assert list(QueuedJob.objects.values_list("id", flat=True)) == [held.id]
    assert not any(QueuedJob.objects.filter(id=row.id).exists() for row in plain)
    assert get_store().get_lock(f"jobguard:unique:{UniqueReport.name}:5") is None
    assert not QueuedJob.objects.filter(id=unique_row.id).exists()


def test_id_batches_refuses_a_zero_batch():
    with pytest.raises(ValueError):
        list(operations.bulk.id_batches(QueuedJob.objects.all(), batch_size=0))


# -- requeue --------------------------------------------------------------------------------


def test_requeue_puts_back_the_job_of_a_silent_worker():
    row = reserved(worker_id="otherhost:1:a")
    Worker.objects.filter(id="otherhost:1:a").update(last_seen_at="2000-01-01T00:00:00Z")
    assert operations.stale_reservations(QueuedJob.objects.with_state()) == {
        str(row.id): "worker otherhost:1:a is gone"}
    result = operations.requeue([row.id], actor="ann")
    assert result.requeued == [str(row.id)]
    fresh = QueuedJob.objects.with_state().get(id=row.id)
    # As if its lease had run out now: waiting (not reserved, not stale), its holder kept
    # as a lease that ran out keeps it, so that the next claim takes it back from a worker
    # that vanished.
    assert fresh.state == "waiting" and fresh.reserved_by == "otherhost:1:a"
    assert operations.stale_reservations(QueuedJob.objects.with_state()) == {}
    assert fresh.attempts == row.attempts  # the crashed run counted, as after its lease
    assert operations.requeue([row.id]).not_reserved == [str(row.id)]  # once
    [again] = queue.claim([row.queue], worker_id="otherhost:2:b")  # claimable at once
    assert again.id == row.id and again.reserved_by == "otherhost:2:b"
    if dialect_for("default").marks_recovered:
        assert again.recovered is True


def _ended_worker_id() -> str:
    """The id of a worker of this host whose process has ended (what ``kill -9`` leaves)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:killed"


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_job_that_kills_its_worker_and_is_requeued_each_time_spends_its_tries():
    """With batched completion a fast job's start waits for its group, except on a row
    taken back from a worker that vanished (the claim's ``recovered``): a job that kills
    its worker within the window is counted from its second run on (docs/guarantees.md).
    A requeue puts the row back as its lease running out does, so the same holds when an
    operator requeues it after each crash (it used to clear the holder: every run's start
    was deferred again and the job never spent a try)."""
    row = waiting(queue_name="crashy")
    recovered = []
    for _run in range(3):
        worker_id = _ended_worker_id()
        [claimed] = queue.claim(["crashy"], worker_id=worker_id, start=0)  # claimed ahead
        recovered.append(claimed.recovered)
        group = Completer(worker_id=worker_id, using="default", window=60.0, batch_size=100)
        group._timer = object()  # no timer thread: the process is killed within the window
        group.ran(claimed.name, 0.001)  # a fast class: its starts may be deferred
        assert group.start(claimed)
        # kill -9 while the job runs: a deferred start is lost with the process
        assert operations.requeue([row.id]).requeued == [str(row.id)]
    assert QueuedJob.objects.get(id=row.id).attempts == 2, recovered  # all but the first
    assert recovered == [False, True, True]


def test_requeue_refuses_the_job_of_a_live_worker():
    row = reserved(worker_id="otherhost:1:b")  # beat just now (the row was created now)
    assert operations.stale_reservations(QueuedJob.objects.with_state()) == {}
    result = operations.requeue([row.id])
    assert result.alive == [str(row.id)] and not result.requeued
    with pytest.raises(operations.RequeueRefused, match="which is alive") as caught:
        operations.requeue_job(str(row.id))
    assert caught.value.code == operations.WORKER_ALIVE
    assert QueuedJob.objects.with_state().get(id=row.id).state == "reserved"


def test_requeue_refuses_a_job_that_is_not_reserved_or_not_queued():
    row = waiting()
    with pytest.raises(operations.RequeueRefused, match="not reserved") as caught:
        operations.requeue_job(str(row.id))
    assert caught.value.code == operations.NOT_RESERVED
    job_id = str(row.id)
    row.delete()
    for missing in (job_id, "not-a-uuid"):
        with pytest.raises(operations.RequeueRefused, match="not queued") as caught:
            operations.requeue_job(missing)
        assert caught.value.code == "not_queued"


def test_requeue_rechecks_the_heartbeat_in_sql(monkeypatch):
    """A worker judged silent that beats before the UPDATE keeps its job."""
    row = reserved(worker_id="otherhost:1:c")
    from django_jobguard.operations import queued

    monkeypatch.setattr(queued, "worker_states",
                        lambda ids, using: dict.fromkeys(ids, "silent"))
    result = operations.requeue([row.id])  # the row's heartbeat is fresh in the database
    assert result.alive == [str(row.id)] and not result.requeued
    assert QueuedJob.objects.with_state().get(id=row.id).state == "reserved"


def test_requeue_refuses_a_fresh_lease_whose_worker_has_no_row():
    """Issue 27 (3): housekeeping deleted the row of a stopped worker, or an operator did;
    the lease was renewed within RETRY_AFTER, so the worker may be running the job."""
    row = reserved(worker_id="otherhost:1:norow", live=False)
    assert not Worker.objects.filter(id="otherhost:1:norow").exists()
    assert operations.worker_states(["otherhost:1:norow"]) == {"otherhost:1:norow": "unknown"}
    assert operations.stale_reservations(QueuedJob.objects.with_state()) == {}
    assert operations.requeue([row.id]).alive == [str(row.id)]
    with pytest.raises(operations.RequeueRefused, match="has no worker row but renewed the "
                                                        "job's lease") as caught:
        operations.requeue_job(str(row.id))
    assert caught.value.code == operations.WORKER_ALIVE
    assert QueuedJob.objects.with_state().get(id=row.id).state == "reserved"


def test_a_worker_without_a_row_whose_process_on_this_host_ended_is_ended():
    """Its id (``host:pid:…``) tells its process: a row-less worker killed here is gone, and
    its job can be requeued at once."""
    import socket

    worker_id = f"{socket.gethostname()}:{2**22 + 6789}:gone"
    row = reserved(worker_id=worker_id, live=False)
    assert operations.worker_states([worker_id]) == {worker_id: "ended"}
    assert operations.stale_reservations(QueuedJob.objects.with_state()) == {
        str(row.id): f"worker {worker_id} is gone"}
    assert operations.requeue([row.id]).requeued == [str(row.id)]
    assert QueuedJob.objects.with_state().get(id=row.id).state == "waiting"


def test_a_worker_row_without_a_process_on_this_host_is_ended():
    import socket

    Worker.objects.create(id="here:1", hostname=socket.gethostname(), pid=2**22 + 12345,
                          queues="default")
    Worker.objects.create(id="there:1", hostname="elsewhere", pid=1, queues="default")
    assert operations.worker_states(["here:1", "there:1", "nobody"]) == {
        "here:1": "ended", "there:1": "alive", "nobody": "unknown"}
