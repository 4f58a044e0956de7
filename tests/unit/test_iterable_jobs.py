"""Iterable jobs in one process (docs/long-jobs.md#iterable-jobs): the checkpoint commits
with each item's writes, runs resume after it, a lost lease rolls the item back. Real worker
processes under SIGTERM and SIGKILL: tests/chaos/test_iterable_jobs.py."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_sync
from django_jobguard.iterable import after
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.testing import drain
from django_jobguard.testing.draining import claim_row
from django_jobguard.worker.pipeline import Pipeline
from tests.support.long_jobs import BadCursor, ItemWriter, LeaseProbe, ThreeSteps

pytestmark = pytest.mark.django_db(transaction=True)


def run_once(job_id: str) -> str:
    """One run of the job, as one worker's claim of it."""
    row = claim_row(job_id, worker_id="test:1:run")
    return Pipeline(worker_id="test:1:run", log_running=False).process(row)


def items(key: str) -> list[str]:
    return list(JobRun.objects.filter(label="item", key__startswith=f"{key}:")
                .order_by("id").values_list("key", flat=True))


def test_every_item_runs_once_and_the_job_finishes():
    ItemWriter("all", 5).dispatch()
    drain()
    assert items("all") == [f"all:{i}" for i in range(5)]
    assert JobRun.objects.filter(label="finished").count() == 1
    assert not QueuedJob.objects.exists()


def test_a_run_resumes_after_the_checkpoint_its_row_holds():
    handle = ItemWriter("resume", 6).dispatch()
    QueuedJob.objects.filter(id=handle.id).update(checkpoint={"cursor": 3, "done": 4})
    drain()
    assert items("resume") == ["resume:4", "resume:5"]


def test_a_lost_lease_rolls_the_item_back_and_hands_the_job_back():
    handle = ItemWriter("lost", 5, steal_at=2).dispatch()
    # The steal happened inside the item's transaction, so it rolled back with the item and
    # the row is this run's again: put back (a real thief's claim would make it LOST).
    assert run_once(handle.id) == "RELEASED"
    assert items("lost") == ["lost:0", "lost:1"]  # item 2 rolled back with its checkpoint
    row = QueuedJob.objects.get(id=handle.id)
    assert row.checkpoint == {"cursor": 1, "done": 2}
    assert row.attempts == 0  # interrupted, not failed


def test_each_committed_item_renews_the_lease_of_its_row():
    """A heartbeat starved past RETRY_AFTER (SQLite, with the items' transactions back to
    back) let another worker take the row of a live run; the checkpoint renews the lease."""
    LeaseProbe().dispatch()
    drain()
    assert list(JobRun.objects.filter(label="lease").values_list("key", flat=True)) == [
        "held"]


def test_max_run_time_splits_the_work_into_runs_without_writing_an_item_twice():
    ItemWriter("budget", 4, max_run_time=1e-9).dispatch()
    drain()
    assert items("budget") == [f"budget:{i}" for i in range(4)]
    runs = JobRun.objects.filter(label="run", key="budget")
    assert runs.count() == 4  # one item per run (a run always commits one at least)
    assert set(runs.values_list("attempt", flat=True)) == {1}  # each run's attempt restored


def test_named_steps_run_in_order_and_resume_after_the_last_one_committed():
    handle = ThreeSteps("s").dispatch()
    QueuedJob.objects.filter(id=handle.id).update(checkpoint={"cursor": "fetch", "done": 1})
    drain()
    assert list(JobRun.objects.order_by("id").values_list("label", flat=True)) == [
        "transform", "load"]


def test_progress_is_the_share_of_items_committed():
    handle = ItemWriter("progress", 4, steal_at=3).dispatch()
    run_once(handle.id)
    row = QueuedJob.objects.get(id=handle.id)
    assert (row.progress, row.progress_message) == (0.75, "3 of 4 items")


def test_a_cursor_that_is_not_json_fails_the_job_naming_it():
    BadCursor().dispatch()
    drain()
    failed = FailedJob.objects.get()
    assert "is not JSON" in failed.message


def test_dispatch_sync_runs_every_item_without_a_checkpoint():
    assert dispatch_sync(ItemWriter("sync", 3)) == "finished"
    assert len(items("sync")) == 3


def test_after_walks_a_queryset_in_chunks_after_the_cursor():
    for i in range(7):
        JobRun.objects.create(label="row", key=str(i), started_at="2026-01-01T00:00:00Z")
    rows = JobRun.objects.filter(label="row")
    first = rows.order_by("pk")[2].pk
    walked = [(cursor, run.key) for cursor, run in after(rows, first, chunk_size=2)]
    assert [key for _, key in walked] == ["3", "4", "5", "6"]
    assert [cursor for cursor, _ in walked] == sorted(cursor for cursor, _ in walked)


def test_a_worker_claim_reads_the_checkpoint_as_json():
    """The claim's raw SQL returns the column as the driver gives it (text on PostgreSQL):
    the row must hold the decoded checkpoint, or a run would start again from the top."""
    from django_jobguard import queue as job_queue

    handle = ItemWriter("claimed", 3).dispatch()
    QueuedJob.objects.filter(id=handle.id).update(checkpoint={"cursor": 1, "done": 2})
    [row] = job_queue.claim(["default"], worker_id="test:1:claim")
    assert row.checkpoint == {"cursor": 1, "done": 2}


def test_the_demo_invoice_export_writes_each_invoice_once_across_interrupted_runs():
    from demo.jobs import ExportInvoices
    from demo.models import Invoice, InvoiceExportLine

    for number in range(7):
        Invoice.objects.create(number=f"INV-{number}", charged=number * 100)
    handle = ExportInvoices("2026-05").dispatch()
    # A first run stopped after three invoices (as SIGTERM would stop it), then resumed.
    QueuedJob.objects.filter(id=handle.id).update(checkpoint={
        "cursor": Invoice.objects.order_by("pk")[2].pk, "done": 3})
    for invoice in Invoice.objects.order_by("pk")[:3]:
        InvoiceExportLine.objects.create(export="2026-05", invoice=invoice,
                                         charged=invoice.charged)
    drain()
    lines = InvoiceExportLine.objects.filter(export="2026-05")
    assert sorted(lines.values_list("invoice__number", flat=True)) == [
        f"INV-{n}" for n in range(7)]
