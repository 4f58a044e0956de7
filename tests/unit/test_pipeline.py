"""Rows the pipeline cannot take to an outcome: each is failed once with the reason, and the
worker goes on to the next job (issue 12, item 3)."""

from __future__ import annotations

import uuid

import pytest
from demo.models import JobRun
from django.utils import timezone

from django_jobguard import Job
from django_jobguard.models import FailedJob, QueuedJob
from tests.support import jobs, make_due, work

pytestmark = pytest.mark.django_db


def _insert(name: str, payload) -> str:
    return str(QueuedJob.objects.create(id=uuid.uuid4(), name=name, queue="default",
                                        payload=payload).id)


def _work_a_few_times() -> list[str]:
    """Run the worker three times, making every row due in between: a row that was put back
    instead of reaching an outcome shows up as claimed again."""
    states = []
    for _ in range(3):
        states += work()
        make_due()
    return states


def test_a_retry_until_out_of_the_range_of_dates_fails_once_with_the_reason():
    bad = _insert(jobs.Record.name, {"args": ["bad"], "kwargs": {},
                                     "retry_until": "0001-01-01T00:00:00+23:59"})
    jobs.Record("good").dispatch()
    states = _work_a_few_times()
    assert sorted(states) == ["DONE", "FAILED"]
    failed = FailedJob.objects.get()
    assert str(failed.id) == bad and failed.attempts == 1
    assert "'retry_until'" in failed.message and "out of the range" in failed.message
    assert list(JobRun.objects.values_list("label", flat=True)) == ["good"]
    assert not QueuedJob.objects.exists()


def test_an_error_outside_the_job_fails_the_row_once_and_the_worker_goes_on(scratch_jobs):
    class BadTries(Job):
        name = "tests.pipeline.BadTries"
        tries = "3"  # a misconfigured class: comparing it to the attempt raises TypeError

        def handle(self):
            raise AssertionError("never runs")

    handle = BadTries().dispatch()
    jobs.Record("good").dispatch()
    states = _work_a_few_times()
    assert sorted(states) == ["DONE", "FAILED"]
    failed = FailedJob.objects.get()
    assert str(failed.id) == handle.id and failed.attempts == 1  # claimed once, not each lease
    assert failed.exception_class == "builtins.TypeError"
    assert failed.reason.startswith("the worker could not process this row: builtins.TypeError")
    assert not QueuedJob.objects.exists()


def test_an_error_after_the_outcome_is_written_is_not_a_second_outcome():
    """A job_processed receiver that raises after the ack: the job stays done, no failed row."""
    from django_jobguard import signals

    def broken(**kwargs):
        raise RuntimeError("receiver bug")

    signals.job_processed.connect(broken)
    try:
        jobs.Record("good").dispatch()
        work()
    finally:
        signals.job_processed.disconnect(broken)
    assert not FailedJob.objects.exists() and not QueuedJob.objects.exists()
    assert JobRun.objects.count() == 1


def test_an_unknown_job_is_put_back_without_an_attempt_within_the_grace():
    job_id = _insert("app.jobs.NotDeployedYet", {"args": [], "kwargs": {}})
    assert work() == ["RELEASED"]
    row = QueuedJob.objects.get(id=job_id)
    assert row.attempts == 0 and row.available_at > row.created_at
    assert "not registered in worker" in row.wait_reason
    assert not FailedJob.objects.exists()


def test_an_unknown_job_fails_at_once_with_no_grace(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "UNKNOWN_JOB_GRACE": 0}
    job_id = _insert("app.jobs.Removed", {"args": [], "kwargs": {}})
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get(id=job_id)
    assert "No job is registered as 'app.jobs.Removed'" in failed.message
    assert "not deployed to the workers yet" in failed.message


def test_a_failed_unknown_job_shows_its_long_message_once(settings, caplog):
    """Issue 30 item 6: the message was in the error record, its made-up traceback and the
    job line: three times per job."""
    import logging

    settings.JOBGUARD = {**settings.JOBGUARD, "UNKNOWN_JOB_GRACE": 0}
    _insert("app.jobs.Removed", {"args": [], "kwargs": {}})
    with caplog.at_level(logging.INFO, logger="django_jobguard"):
        assert work() == ["FAILED"]
    shown = "\n".join(logging.Formatter("%(message)s").format(r) for r in caplog.records)
    assert shown.count("No job is registered as 'app.jobs.Removed'") == 2  # record, job line
    assert shown.count("JOB_MODULES") == 1 and "Traceback" not in shown
    (line,) = [r for r in caplog.records if getattr(r, "state", "") == "FAILED"]
    assert line.detail.endswith("since it was queued."), line.detail  # its first sentence


def test_a_row_whose_arguments_this_workers_class_does_not_take_waits_like_an_unknown_job():
    """Issue 30 item 2: another version of the class queued it (a rolling deploy)."""
    job_id = _insert(jobs.Record.name, {"args": ["x"], "kwargs": {"force": True}})
    assert work() == ["RELEASED"]
    row = QueuedJob.objects.get(id=job_id)
    assert row.attempts == 0 and row.available_at > row.created_at
    assert "cannot rebuild it (got an unexpected keyword argument 'force'" in row.wait_reason
    assert not FailedJob.objects.exists()


def test_an_exception_in_init_fails_the_job_at_its_first_attempt(scratch_jobs):
    """Not an argument mismatch: every retry would build it the same way (docs/worker.md)."""

    class Picky(Job):
        name = "tests.pipeline.Picky"
        tries = 3

        def __init__(self, order: int):
            if order < 0:
                raise ValueError("order must be positive")
            self.order = order

        def handle(self):
            return None

    job_id = _insert(Picky.name, {"args": [-1], "kwargs": {}})
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get(id=job_id)
    assert failed.attempts == 1 and "order must be positive" in failed.message


@pytest.mark.parametrize("raised", [SystemExit(0), KeyboardInterrupt()],
                         ids=["SystemExit", "KeyboardInterrupt"])
def test_a_job_raising_systemexit_is_retried_then_failed_and_the_worker_goes_on(
        scratch_jobs, raised):
    """Issue 12 item 1: ``sys.exit()`` in a job is that job's failure, never a worker stop."""

    class Exits(Job):
        name = "tests.pipeline.Exits"
        tries = 2

        def handle(self):
            JobRun.objects.create(label="exits", job_id=self.job_id or "",
                                  started_at=timezone.now())
            raise raised

    handle = Exits().dispatch()
    jobs.Record("good").dispatch()
    states = _work_a_few_times()
    assert sorted(states) == ["DONE", "FAILED", "RELEASED"]  # retried once, per its tries
    assert JobRun.objects.filter(label="exits").count() == 2
    failed = FailedJob.objects.get()
    assert str(failed.id) == handle.id and failed.attempts == 2
    assert failed.exception_class == f"builtins.{type(raised).__name__}"
    assert not QueuedJob.objects.exists()


def test_a_job_interrupted_for_a_worker_restart_goes_back_without_using_an_attempt(
        scratch_jobs):
    """``jobworker --reload`` raises WorkerRestartError in a job still running after its
    grace period (tests/integration/test_reload.py runs the real thing)."""
    from django_jobguard.exceptions import WorkerRestartError

    class Restarted(Job):
        name = "tests.pipeline.Restarted"

        def handle(self):
            row = QueuedJob.objects.get(id=self.job_id)
            JobRun.objects.create(label="restarted", attempt=self.context.attempt,
                                  key=f"{row.exceptions}:{row.wait_reason}",
                                  started_at=timezone.now())
            if JobRun.objects.filter(label="restarted").count() == 1:
                raise WorkerRestartError("the code changed")

    Restarted().dispatch()
    # Back at once and run again; tries=1, so a counted attempt would have failed it.
    assert work() == ["RELEASED", "DONE"]
    runs = list(JobRun.objects.order_by("id").values_list("attempt", "key"))
    assert runs == [(1, "0:"), (1, "0:its worker restarted for a code change")]
    assert not QueuedJob.objects.exists()
    assert not FailedJob.objects.exists()


# -- relaxed acks (JOBGUARD["SYNCHRONOUS_ACKS"]) -------------------------------------------


class KeptNoop(Job):
    name = "tests.unit.test_pipeline.KeptNoop"
    keep_result = True

    def handle(self) -> str:
        return "kept"


@pytest.fixture
def ack_spy(monkeypatch):
    """The ``relaxed`` flag of every ack the dialect is asked for (the outermost call: the
    generic ``ack_and_start`` calls ``ack``)."""
    from django_jobguard.dialects import dialect_for

    dialect = dialect_for("default")
    seen: list[bool] = []
    depth = [0]
    for method in ("ack", "ack_and_start", "ack_counting"):
        original = getattr(dialect, method)

        def spy(*args, _original=original, relaxed=False, **kwargs):
            if not depth[0]:
                seen.append(relaxed)
            depth[0] += 1
            try:
                return _original(*args, relaxed=relaxed, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(dialect, method, spy)
    return seen


@pytest.mark.django_db(transaction=True)
def test_a_workers_acks_do_not_wait_for_the_disk_by_default(ack_spy):
    """The plain ack, the one that starts the row claimed ahead, and the ack in the
    transaction that stores a result: all of the worker's own are relaxed."""
    for _ in range(3):
        jobs.Noop().dispatch()
    KeptNoop().dispatch()
    assert work(batch=4) == ["DONE"] * 4
    assert ack_spy == [True] * 4


@pytest.mark.django_db(transaction=True)
def test_synchronous_acks_wait_for_the_disk(ack_spy, settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "SYNCHRONOUS_ACKS": True}
    jobs.Noop().dispatch()
    KeptNoop().dispatch()
    assert work() == ["DONE", "DONE"]
    assert ack_spy == [False, False]


@pytest.mark.django_db(transaction=True)
def test_an_ack_inside_a_callers_transaction_is_never_relaxed(ack_spy):
    from django.db import transaction

    from django_jobguard import queue

    jobs.Noop().dispatch()
    jobs.Noop().dispatch()
    first, second = queue.claim(["default"], worker_id="w", limit=2, start=2)
    with transaction.atomic():  # the caller's: its other writes keep their durability
        assert queue.ack(first) is True
        assert queue.ack(second, own_transaction=True) is True  # one opened for the ack
    assert ack_spy == [False, True]
