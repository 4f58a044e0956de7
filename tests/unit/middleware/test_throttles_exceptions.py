"""ThrottlesExceptions and Skip, in-process on both stores (the multi-process circuit test is
in test_limits_processes.py)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

import pytest
from demo.models import Profile
from django.utils import timezone

from django_jobguard import Job, Skip, ThrottlesExceptions
from django_jobguard.exceptions import (
    JobTimeoutError,
    StoreUnavailableError,
    WorkerStoppedError,
)
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from django_jobguard.testing import drain
from tests.support import limit_jobs, make_due, wait_for, work
from tests.support.limit_jobs import Flaky

pytestmark = pytest.mark.django_db

KEY = f"jobguard:circuit:{Flaky.name}"


@pytest.fixture(autouse=True)
def _clear_calls():
    limit_jobs.CALLS.clear()


def configure(monkeypatch, outcomes, **circuit):
    monkeypatch.setattr(Flaky, "outcomes", list(outcomes))
    # Backoffs keep each retry for the next round (make_due), one run per work().
    monkeypatch.setattr(Flaky, "circuit", {"max_attempts": 3, "decay_seconds": 60,
                                           "backoff": 30, **circuit})


def circuit(key: str = KEY):
    return next((t for t in get_store().throttles() if t.key == key), None)


def run_rounds(n: int) -> list[str]:
    states = []
    for _ in range(n):
        states += work()
        make_due()
    return states


def test_validation():
    with pytest.raises(ValueError, match="max_attempts"):
        ThrottlesExceptions(0)
    with pytest.raises(ValueError, match="decay_seconds"):
        ThrottlesExceptions(5, 0)
    with pytest.raises(ValueError, match="backoff"):
        ThrottlesExceptions(5, 60, -1)
    with pytest.raises(ValueError, match="not both"):
        ThrottlesExceptions(by="x", by_job=True)
    with pytest.raises(TypeError, match="when=..."):
        ThrottlesExceptions(when=42)
    with pytest.raises(TypeError, match="report"):
        ThrottlesExceptions(report="yes")


def test_counted_exception_is_released_with_backoff_and_not_seen_by_the_worker(
        store_alias, monkeypatch, released):
    configure(monkeypatch, ["fail"], backoff=30)
    Flaky().dispatch()
    assert work() == ["RELEASED"]
    row = QueuedJob.objects.get()
    assert row.attempts == 1  # a counted failure is a real run: it used a try
    assert row.exceptions == 0  # handled by the middleware: max_exceptions untouched
    assert row.last_error.startswith("tests.support.limit_jobs.GatewayDown: flaky failed")
    assert "Traceback" in row.last_error
    assert [(r["reason"], r["delay"]) for r in released] == [("released", 30.0)]
    info = circuit()
    assert (info.kind, info.state, info.hits, info.limit) == ("circuit", "closed", 1, 3)


def test_a_counted_failure_names_its_circuit_in_the_job_line(store_alias, monkeypatch, caplog):
    """Issue 30 item 6: not ``RELEASED (released, ...)``."""
    configure(monkeypatch, ["fail"] * 3, backoff=30)
    Flaky().dispatch()
    with caplog.at_level(logging.INFO, logger="django_jobguard.worker.jobs"):
        assert run_rounds(3) == ["RELEASED"] * 3
    details = [r.detail for r in caplog.records if getattr(r, "state", "") == "RELEASED"]
    label = KEY.removeprefix("jobguard:circuit:")
    assert details == [
        f"counted by circuit {label!r}: 1 of 3 failures, retry in 30 s",
        f"counted by circuit {label!r}: 2 of 3 failures, retry in 30 s",
        f"counted by circuit {label!r}: 3 of 3 failures, now open, retry in 30 s"]


def test_max_attempts_open_the_circuit_and_open_deferrals_keep_tries(
        store_alias, monkeypatch, released):
    configure(monkeypatch, ["fail"] * 3)
    Flaky().dispatch()
    assert run_rounds(3) == ["RELEASED"] * 3
    info = circuit()
    assert (info.state, info.hits) == ("open", 3)
    assert 55 < (info.resets_at - get_store().now()).total_seconds() <= 60
    attempts = QueuedJob.objects.get().attempts
    assert run_rounds(2) == ["RELEASED"] * 2
    assert [r["reason"] for r in released[-2:]] == ["circuit_open"] * 2
    assert all(50 < r["delay"] <= 61 for r in released[-2:])
    assert QueuedJob.objects.get().attempts == attempts  # open-circuit deferrals are free
    assert len(limit_jobs.CALLS) == 3  # it did not run while open


def test_other_classes_sharing_by_are_held_and_others_are_not(store_alias, released):
    Profile.objects.create(name="gateway", syncs=0)
    limit_jobs.GatewayA("a").dispatch()
    assert work() == ["RELEASED"] * 6  # five failures retried at once (backoff 0), then held
    assert [r["reason"] for r in released] == ["released"] * 5 + ["circuit_open"]
    assert circuit("jobguard:circuit:gateway").state == "open"
    limit_jobs.GatewayB("b").dispatch()
    Flaky("independent").dispatch()
    assert sorted(work()) == ["DONE", "RELEASED"]
    assert [(r["sender"].__name__, r["reason"]) for r in released[6:]] == [
        ("GatewayB", "circuit_open")]
    assert limit_jobs.CALLS == [("independent", "ok", 1)]


def test_half_open_lets_one_probe_through_failure_reopens_success_resets(
        store_alias, monkeypatch, jobguard_clock):
    # The decays pass on the test clock: with decay_seconds=0.5 a test stalled half a second
    # saw the reopened circuit half-open again (and the second job run as a new probe).
    configure(monkeypatch, ["fail", "fail", "fail", "fail", "ok"])  # decay 60 s
    Flaky("first").dispatch()
    assert run_rounds(3) == ["RELEASED"] * 3
    assert circuit().state == "open"
    jobguard_clock.advance(60)
    assert circuit().state == "half-open"
    Flaky("second").dispatch()
    make_due()
    states = work()  # the first job claimed is the probe; it fails and reopens the circuit
    assert states[0] == "RELEASED" and circuit().state == "open" and circuit().hits == 4
    assert len(limit_jobs.CALLS) == 4  # only the probe ran
    jobguard_clock.advance(60)
    assert circuit().state == "half-open"
    make_due()
    assert sorted(work()) == ["DONE", "DONE"]  # the probe succeeded, then the other ran
    assert circuit() is None  # reset
    assert [c[1] for c in limit_jobs.CALLS] == ["fail"] * 4 + ["ok", "ok"]


def test_a_release_is_not_a_success(store_alias, monkeypatch):
    """PR #61293: the job released itself, so the failures must still count."""
    configure(monkeypatch, ["fail", "fail", "release", "ok"])
    Flaky().dispatch()
    run_rounds(2)
    assert circuit().hits == 2
    assert run_rounds(1) == ["RELEASED"]
    assert circuit().hits == 2 and circuit().state == "closed"
    assert run_rounds(1) == ["DONE"]
    assert circuit() is None


def test_when_rejects_exceptions_to_the_worker_without_touching_the_circuit(
        store_alias, monkeypatch):
    configure(monkeypatch, ["uncounted"], when=limit_jobs.GatewayDown)
    Flaky().dispatch()
    assert work() == ["RELEASED"]
    row = QueuedJob.objects.get()
    assert row.exceptions == 1 and "NotCounted" in row.last_error  # the worker's normal path
    assert circuit() is None


def test_when_accepts_a_predicate(store_alias, monkeypatch):
    configure(monkeypatch, ["fail", "uncounted"], when=lambda exc: "failed" in str(exc))
    Flaky().dispatch()
    run_rounds(2)
    assert circuit().hits == 1
    assert QueuedJob.objects.get().exceptions == 1


def test_delete_when_drops_the_job_silently(store_alias, monkeypatch, caplog):
    configure(monkeypatch, ["gone"], delete_when=(limit_jobs.Gone, KeyError))
    Flaky().dispatch()
    with caplog.at_level(logging.INFO, logger="django_jobguard.worker.jobs"):
        assert work() == ["SKIPPED"]  # dropped, not done: its handle() raised
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert circuit() is None
    (line,) = [r for r in caplog.records if getattr(r, "state", "") == "SKIPPED"]
    assert line.detail == "delete_when matched Gone"


# -- a timeout matched by delete_when: a sync job and an async job end alike ------------------


def _times_out(run: str, delete_when):
    """A ``run`` (sync or async) job whose handle() outlasts its timeout, inside a circuit
    that drops the job on ``delete_when``; tries are left, so its timeout alone would retry
    it (the sync job's is SIGALRM's JobTimeoutError, the async job's its task cancelled)."""
    circuit = ThrottlesExceptions(max_attempts=1, decay_seconds=60, backoff=60,
                                  delete_when=delete_when).by("times-out")
    if run == "sync":
        class TimesOut(Job):
            name = "tests.throttles.TimesOutSync"
            tries, timeout, backoff = 3, 0.3, 60  # (a retry is not run by drain())

            def middleware(self):
                return [circuit]

            def handle(self):
                limit_jobs.CALLS.append(("times-out", run))
                time.sleep(30)

        return TimesOut

    class AsyncTimesOut(Job):
        name = "tests.throttles.TimesOutAsync"
        tries, timeout, backoff = 3, 0.3, 60

        def middleware(self):
            return [circuit]

        async def handle(self):
            limit_jobs.CALLS.append(("times-out", run))
            await asyncio.sleep(30)

    return AsyncTimesOut


@pytest.mark.usefixtures("scratch_jobs")
@pytest.mark.parametrize("delete_when", [
    JobTimeoutError, lambda exc: isinstance(exc, JobTimeoutError)], ids=["class", "callable"])
@pytest.mark.parametrize("run", ["sync", "async"])
def test_a_timeout_matched_by_delete_when_drops_the_job_sync_or_async(store_alias, run,
                                                                       delete_when):
    """Before, the sync job was acked as DONE (the middleware swallowed its JobTimeoutError)
    and the async one retried by its timeout rules (its cancellation went on to the worker,
    which turned it into JobTimeoutError again). Both are dropped now, and not counted."""
    _times_out(run, delete_when)().dispatch()
    assert drain().states == ["SKIPPED"]
    assert [("times-out", run)] == limit_jobs.CALLS  # it ran once
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert circuit("jobguard:circuit:times-out") is None


@pytest.mark.usefixtures("scratch_jobs")
@pytest.mark.parametrize("run", ["sync", "async"])
def test_an_outer_circuit_does_not_count_a_timeout_an_inner_one_dropped_the_job_for(
        store_alias, run):
    """An inner circuit's ``delete_when`` drops the job on its timeout: the outer circuit
    sees a run that was neither a success nor a failure (the async job's cancellation goes
    on through the outer one; a sync job's inner middleware swallowed its timeout)."""
    def middleware(self):
        return [ThrottlesExceptions(max_attempts=1, decay_seconds=60).by("outer"),
                *type(self).inner()]

    job_class = _times_out(run, JobTimeoutError)
    inner = job_class.middleware
    nested = type("Nested" + job_class.__name__, (job_class,), {
        "name": job_class.name + ".Nested", "inner": lambda: inner(None),
        "middleware": middleware})
    nested().dispatch()
    assert drain().states == ["SKIPPED"]
    assert circuit("jobguard:circuit:outer") is None
    assert circuit("jobguard:circuit:times-out") is None


@pytest.mark.usefixtures("scratch_jobs")
@pytest.mark.parametrize("run", ["sync", "async"])
def test_a_timeout_delete_when_does_not_match_still_counts_and_retries(store_alias, run):
    _times_out(run, KeyError)().dispatch()
    assert drain().states == ["RELEASED"]  # the worker's timeout rules: tries are left
    row = QueuedJob.objects.get()
    assert row.attempts == 1 and "JobTimeoutError" in row.last_error
    assert circuit("jobguard:circuit:times-out").hits == 1


@pytest.mark.usefixtures("scratch_jobs")
@pytest.mark.parametrize("delete_when", [None, lambda exc: True], ids=["none", "anything"])
def test_a_stop_raised_into_a_sync_job_is_neither_counted_nor_dropped(store_alias,
                                                                      delete_when):
    """As an async job's stop: the worker puts the job back without using a try. Before, the
    middleware took the stop for the service failing: counted (here opening the circuit) and
    released using a try, or dropped by a delete_when that took it."""
    from django_jobguard import queue
    from django_jobguard.worker.pipeline import Pipeline

    class Stopped(Job):
        name = "tests.throttles.Stopped"
        tries = 3

        def middleware(self):
            return [ThrottlesExceptions(max_attempts=1, decay_seconds=60,
                                        delete_when=delete_when).by("stopped")]

        def handle(self):  # as a second Ctrl-C (or --reload past its grace) raises it
            raise WorkerStoppedError(WorkerStoppedError.detail)

    Stopped().dispatch()
    (row,) = queue.claim(["default"], worker_id="w-stop", limit=1, start=1)
    assert Pipeline(worker_id="w-stop").process(row) == "RELEASED"
    row = QueuedJob.objects.get()
    assert (row.attempts, row.exceptions, row.last_error) == (0, 0, "")
    assert circuit("jobguard:circuit:stopped") is None


@pytest.mark.usefixtures("scratch_jobs")
@pytest.mark.parametrize("run", ["sync", "async"])
@pytest.mark.parametrize("ends, delete_when, state", [
    ("stop", None, "RELEASED"), ("timeout", None, "FAILED"),
    ("timeout", JobTimeoutError, "SKIPPED")], ids=["stop", "timeout", "dropped-timeout"])
def test_a_store_outage_as_the_circuit_records_a_stop_or_a_timeout_does_not_replace_it(
        store_alias, monkeypatch, caplog, run, ends, delete_when, state):
    """The circuit's store is down as a job's stop or timeout reaches the middleware: the
    stop still puts the job back without using its only try, the timeout still follows its
    timeout rules (or the drop delete_when asks for); the outage is logged. Before, a sync
    job's StoreUnavailableError replaced it: the worker failed the job with the outage."""
    from django_jobguard import aio, queue
    from django_jobguard.worker.pipeline import Pipeline

    circuit_middleware = ThrottlesExceptions(max_attempts=3, decay_seconds=60,
                                             delete_when=delete_when).by("interrupted")

    class Interrupted(Job):
        name = "tests.throttles.Interrupted"
        tries, timeout = 1, 0.3

        def middleware(self):
            return [circuit_middleware]

        def handle(self):  # as a second Ctrl-C raises it, or the job's time limit
            if ends == "stop":
                raise WorkerStoppedError(WorkerStoppedError.detail)
            raise JobTimeoutError("The job has timed out after 0.3 s.")

    class AsyncInterrupted(Interrupted):
        name = "tests.throttles.AsyncInterrupted"

        async def handle(self):  # its task cancelled by a stop, or by its timeout
            if ends == "stop":
                aio.stop_all()
            await asyncio.sleep(30)

    def leave_fails(self, key, **kwargs):
        raise StoreUnavailableError(self.alias, "connection refused")

    monkeypatch.setattr(type(get_store()), "circuit_leave", leave_fails)
    (AsyncInterrupted if run == "async" else Interrupted)().dispatch()
    (row,) = queue.claim(["default"], worker_id="w-outage", limit=1, start=1)
    with caplog.at_level(logging.WARNING, logger="django_jobguard.limits"):
        assert Pipeline(worker_id="w-outage").process(row) == state
    if ends == "stop":  # back, its one try intact, no error of its own
        row = QueuedJob.objects.get()
        assert (row.attempts, row.exceptions, row.last_error) == (0, 0, "")
    elif delete_when is None:  # its last try timed out
        assert FailedJob.objects.get().exception_class.endswith(".JobTimeoutError")
    else:
        assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert any(r.name == "django_jobguard.limits" and "could not" in r.getMessage()
               and "jobguard:circuit:interrupted" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("scratch_jobs")
@pytest.mark.parametrize("run", ["sync", "async"])
@pytest.mark.parametrize("ends, delete_when, state", [
    ("stop", None, "RELEASED"), ("timeout", None, "FAILED"),
    ("timeout", JobTimeoutError, "SKIPPED"), ("success", None, "DONE")],
    ids=["stop", "timeout", "dropped-timeout", "success"])
def test_the_database_stores_outage_as_the_circuit_records_a_run_does_not_replace_it(
        caplog, run, ends, delete_when, state):
    """The test above with the real database store: its database cannot be reached as the
    job's stop, timeout or success reaches the middleware (its statements fail as on a cut
    connection), and the store raises StoreUnavailableError, as the Redis store does. Before,
    its raw OperationalError became the job's exception: the worker failed the stopped sync
    job (its only try used), the timed-out one with the OperationalError instead of its
    timeout, the job whose timeout delete_when drops (sync or async), and a successful run;
    an async job's stop or timeout ended right, its circuit's error logged as the database's."""
    from django_jobguard import aio, queue
    from django_jobguard.worker.pipeline import Pipeline
    from tests.support.store_faults import statements_fail

    circuit_middleware = ThrottlesExceptions(max_attempts=3, decay_seconds=60,
                                             delete_when=delete_when,
                                             store="database").by("cut-off")

    with statements_fail(down=False) as switch:  # up as the job enters the circuit
        class CutOff(Job):
            name = "tests.throttles.CutOff"
            tries, timeout = 1, 0.3

            def middleware(self):
                return [circuit_middleware]

            def handle(self):
                switch.down = True  # the store's database goes away as the job runs
                if ends == "stop":  # as a second Ctrl-C raises it, or the job's time limit
                    raise WorkerStoppedError(WorkerStoppedError.detail)
                if ends == "timeout":
                    raise JobTimeoutError("The job has timed out after 0.3 s.")

        class AsyncCutOff(CutOff):
            name = "tests.throttles.AsyncCutOff"

            async def handle(self):  # its task cancelled by a stop or its timeout, or done
                switch.down = True
                if ends == "success":
                    return
                if ends == "stop":
                    aio.stop_all()
                await asyncio.sleep(30)

        (AsyncCutOff if run == "async" else CutOff)().dispatch()
        (row,) = queue.claim(["default"], worker_id="w-cut", limit=1, start=1)
        with caplog.at_level(logging.WARNING, logger="django_jobguard.limits"):
            assert Pipeline(worker_id="w-cut").process(row) == state
        assert switch.failed  # the circuit's store was asked, and failed
    if ends == "stop":  # back, its one try intact, no error of its own
        row = QueuedJob.objects.get()
        assert (row.attempts, row.exceptions, row.last_error) == (0, 0, "")
    elif ends == "timeout" and delete_when is None:  # its last try timed out
        assert FailedJob.objects.get().exception_class.endswith(".JobTimeoutError")
        assert not QueuedJob.objects.exists()
    else:  # dropped, or done
        assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert any(r.name == "django_jobguard.limits" and "could not record it" in r.getMessage()
               and "jobguard:circuit:cut-off" in r.getMessage()
               and "store 'database' is unavailable" in r.getMessage()
               and r.levelno == logging.WARNING and not r.exc_info  # (async too: one line)
               for r in caplog.records)
    # The database is back: the circuit records again (nothing was recorded meanwhile).
    store = get_store("database")
    assert circuit("jobguard:circuit:cut-off") is None
    assert store.circuit_leave("jobguard:circuit:cut-off", owner="next", outcome="failure",
                               max_attempts=3, decay=60).failures == 1


def _outage_lines(caplog) -> list[tuple[int, str, bool]]:
    return [(r.levelno, r.getMessage(), bool(r.exc_info)) for r in caplog.records
            if r.name == "django_jobguard.limits"]


@pytest.mark.parametrize("reason, ends_with, ends", [
    ("stopped", "WorkerStoppedError", "goes on"), ("stopped", "WorkerStoppedError", "returns"),
    ("stopped", "WorkerStoppedError", "raises"), (None, "WorkerStoppedError", "goes on"),
    ("cancelled", "JobCancelledError", "goes on"), ("cancelled", "JobCancelledError", "raises")])
def test_an_async_stop_or_cancel_the_circuit_cannot_record_is_logged_as_a_sync_stop_is(
        store_alias, monkeypatch, caplog, reason, ends_with, ends):
    """The circuit's store is down as an async job's run is cut short (a stop, a task
    cancelled for no reason, an operator's cancel; the cancellation going on, or caught by
    the job, which returns or raises another exception): one warning line, the one a sync
    job's stop gets (``_unrecorded``), naming the exception the run ends with. Before, an
    ERROR with the outage's traceback, worded otherwise (``could not leave circuit ... as it
    was cancelled``)."""
    from asgiref.sync import async_to_sync

    from django_jobguard.context import JobContext

    throttle = ThrottlesExceptions(max_attempts=3, decay_seconds=60).by("cut-short")

    def leave_fails(self, key, **kwargs):
        raise StoreUnavailableError(self.alias, "connection refused")

    monkeypatch.setattr(type(get_store()), "circuit_leave", leave_fails)
    expected = [(logging.WARNING,
                 f"{Flaky.name} [run-1] ended with {ends_with}, but circuit "
                 f"jobguard:circuit:cut-short could not record it (store {store_alias!r} is "
                 f"unavailable: connection refused).", False)]

    if ends_with == "WorkerStoppedError":  # the sync path's line, to compare with
        sync_job = Flaky()
        sync_job.context = JobContext(job_id="run-1")

        def stopped(job):  # as a second Ctrl-C raises it into a sync job
            raise WorkerStoppedError(WorkerStoppedError.detail)

        with caplog.at_level(logging.WARNING, logger="django_jobguard.limits"), \
                pytest.raises(WorkerStoppedError):
            throttle.handle(sync_job, stopped)
        assert _outage_lines(caplog) == expected
        caplog.clear()

    async_job = Flaky()
    async_job.context = JobContext(job_id="run-1")
    async_job.context.cut_short = reason  # as JobRun.cancel() marks the run it cancels

    async def cut_short(job):
        if ends == "goes on":
            raise asyncio.CancelledError
        if ends == "raises":  # it caught its cancellation and turned it into another error
            raise ValueError("cleaning up after the cancel failed")
        return "swallowed"  # it caught its cancellation and returned

    async def run() -> str:  # (async_to_sync: the circuit's calls run in this thread)
        try:
            await throttle.ahandle(async_job, cut_short)
        except asyncio.CancelledError:
            return "goes on"
        except ValueError:
            return "raises"
        return "returns"

    with caplog.at_level(logging.WARNING, logger="django_jobguard.limits"):
        assert async_to_sync(run)() == ends
    assert _outage_lines(caplog) == expected


@pytest.mark.usefixtures("scratch_jobs")
@pytest.mark.parametrize("cut", ["cancel", "stop", "timeout"])
@pytest.mark.parametrize("state", ["closed", "half-open"])
def test_an_async_job_that_swallows_its_cancellation_did_not_succeed(store_alias, state,
                                                                      cut):
    """Its first run fails (counted), its second is cancelled by an operator (stopped, timed
    out) while it awaits, catches ``asyncio.CancelledError`` and returns. The worker ends
    that run as cut short all the same, and so does the circuit: a cancel or a stop leaves
    it as it was (a half-open probe freed), a timeout counts. Before, it closed (reset) the
    circuit as a real success."""
    from asgiref.sync import sync_to_async

    from django_jobguard import aio, operations, queue
    from django_jobguard.worker.pipeline import Pipeline

    half_open = state == "half-open"
    decay = 2 if half_open else 60
    key = "jobguard:circuit:swallows"

    class Swallows(Job):
        name = "tests.throttles.Swallows"
        tries, backoff, timeout = 5, 0, 0.5 if cut == "timeout" else 30

        def middleware(self):
            return [ThrottlesExceptions(max_attempts=1 if half_open else 3,
                                        decay_seconds=decay).by("swallows")]

        async def handle(self):
            if self.context.attempt == 1:
                raise ConnectionError("service down")  # counted: 1 failure
            if cut == "cancel":
                await sync_to_async(operations.cancel_job)(self.job_id)
            elif cut == "stop":
                aio.stop_all()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return "swallowed"

    Swallows().dispatch()
    (row,) = queue.claim(["default"], worker_id="w", limit=1, start=1)
    assert Pipeline(worker_id="w").process(row) == "RELEASED"
    if half_open:  # the next run is the probe
        wait_for(lambda: circuit(key).state == "half-open", timeout=10)
    else:
        assert (circuit(key).state, circuit(key).hits) == ("closed", 1)
    make_due()
    (row,) = queue.claim(["default"], worker_id="w", limit=1, start=1)
    assert Pipeline(worker_id="w").process(row) == {
        "cancel": "CANCELLED", "stop": "RELEASED", "timeout": "RELEASED"}[cut]
    if cut == "stop":  # back, the stopped run's attempt unused (the first run's counted)
        assert QueuedJob.objects.get().attempts == 1
    elif cut == "timeout":  # back as a retry, the timeout its last error
        row = QueuedJob.objects.get()
        assert row.attempts == 2 and "JobTimeoutError" in row.last_error
    else:
        assert not QueuedJob.objects.exists()
    after = circuit(key)  # (None: reset, as after a success)
    assert after is not None and after.hits == (2 if cut == "timeout" else 1)
    if cut == "timeout":  # counted: the probe's failure opens it again
        assert after.state == ("open" if half_open else "closed")
    else:
        assert after.state == state
        if half_open:  # the probe was freed: the next job is let in as the probe
            entry = get_store().circuit_enter(key, owner="next", max_attempts=1, decay=decay,
                                              probe_lease=60)
            assert entry.admitted


@pytest.mark.parametrize("ends", ["returns", "raises"])
@pytest.mark.parametrize("reason", ["cancelled", "stopped"])
def test_a_swallowed_cancellation_is_the_run_s_not_its_task_s(store_alias, reason, ends):
    """Why a run was cut short is read from its context, not from the task it runs in: a job
    that caught its cancellation and went on past the grace period (its task forgotten by
    then), or a ThrottlesExceptions behind a sync-only middleware (run in another task),
    neither closes the circuit as a success when it returns nor counts a failure when it
    turns the cancellation into another exception: a cancel or a stop leaves it as it was."""
    from asgiref.sync import async_to_sync

    from django_jobguard.context import JobContext

    key = "jobguard:circuit:swallowed-late"
    throttle = ThrottlesExceptions(max_attempts=3, decay_seconds=60).by("swallowed-late")
    store = get_store()
    entry = store.circuit_enter(key, owner="first", max_attempts=3, decay=60, probe_lease=60)
    assert entry.admitted
    store.circuit_leave(key, owner="first", max_attempts=3, decay=60, outcome="failure")
    assert (circuit(key).state, circuit(key).hits) == ("closed", 1)

    job = Flaky()
    job.context = JobContext(job_id="late")
    job.context.cut_short = reason  # as JobRun.cancel() marks the run it cancels

    async def swallowed(job):
        job.context.handle_finished = True
        if ends == "raises":
            raise ValueError("cleaning up after the cancel failed")
        job.context.handle_returned = True
        return "swallowed"

    # No JobRun holds this task: before, the circuit saw a success and was reset (None), or
    # counted the ValueError as the service's failure (2 hits, the job released).
    # (async_to_sync: the circuit's calls run in this thread, in the test's transaction.)
    if ends == "raises":
        with pytest.raises(ValueError):
            async_to_sync(throttle.ahandle)(job, swallowed)
    else:
        assert async_to_sync(throttle.ahandle)(job, swallowed) == "swallowed"
    assert job.context.requested is None
    assert (circuit(key).state, circuit(key).hits) == ("closed", 1)


def test_report_true_logs_counted_exceptions(store_alias, monkeypatch, caplog):
    configure(monkeypatch, ["fail"], report=True)
    Flaky().dispatch()
    with caplog.at_level(logging.WARNING, logger="django_jobguard.limits"):
        work()
    (record,) = [r for r in caplog.records if r.name == "django_jobguard.limits"]
    assert "counted by ThrottlesExceptions" in record.getMessage() and record.exc_info


def test_report_callable_receives_the_exception(store_alias, monkeypatch):
    seen = []
    configure(monkeypatch, ["fail", "uncounted"], report=seen.append,
              when=limit_jobs.GatewayDown)
    Flaky().dispatch()
    run_rounds(2)
    assert [type(e).__name__ for e in seen] == ["GatewayDown"]  # only counted ones


def test_the_last_attempt_fails_with_the_real_exception(store_alias, monkeypatch):
    """Laravel ends with MaxAttemptsExceeded and loses the error (horizon#1514)."""
    configure(monkeypatch, ["fail", "fail"], max_attempts=10)
    monkeypatch.setattr(Flaky, "tries", 2)
    Flaky().dispatch()
    assert run_rounds(2) == ["RELEASED", "FAILED"]
    failed = FailedJob.objects.get()
    assert failed.exception_class == "tests.support.limit_jobs.GatewayDown"
    assert "flaky failed" in failed.message and "Traceback" in failed.traceback
    assert circuit().hits == 2


def test_works_with_retry_until(store_alias, monkeypatch):
    configure(monkeypatch, ["fail"] * 8, max_attempts=100)
    monkeypatch.setattr(Flaky, "tries", 1)
    monkeypatch.setattr(Flaky, "retry_until",
                        lambda self: timezone.now() + datetime.timedelta(hours=1))
    Flaky().dispatch()
    assert run_rounds(6) == ["RELEASED"] * 6  # tries=1 is ignored while the deadline is ahead
    row = QueuedJob.objects.get()
    QueuedJob.objects.update(payload={**row.payload,
                                      "retry_until": timezone.now().isoformat()})
    make_due()
    states = work()
    assert states == ["FAILED"]
    assert FailedJob.objects.get().exception_class.endswith("MaxAttemptsExceededError")


def test_a_timeout_counts_and_reaches_the_worker(store_alias, monkeypatch):
    configure(monkeypatch, ["timeout"])
    Flaky().dispatch()
    assert work() == ["RELEASED"]
    assert "JobTimeoutError" in QueuedJob.objects.get().last_error
    assert circuit().hits == 1


def test_by_job_keeps_one_circuit_per_queued_job(store_alias, monkeypatch):
    configure(monkeypatch, ["fail", "fail"], by_job=True)
    first, second = Flaky("one").dispatch(), Flaky("two").dispatch()
    work()
    keys = sorted(t.key for t in get_store().throttles())
    assert keys == sorted(f"{KEY}:{d.id}" for d in (first, second))


def test_by_accepts_a_function_of_the_job(store_alias, monkeypatch):
    configure(monkeypatch, ["fail"], by=lambda job: f"label-{job.label}")
    Flaky("x").dispatch()
    work()
    assert circuit("jobguard:circuit:label-x").hits == 1


def test_by_chains():
    middleware = ThrottlesExceptions(5, 60).by("sms")
    assert middleware.circuit_key(Flaky()) == "jobguard:circuit:sms"
    assert "by='sms'" in repr(middleware)


# -- Skip --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, flag, runs", [
    ("when-bool", True, False), ("when-bool", False, True),
    ("unless-bool", True, True), ("unless-bool", False, False),
    ("when-job", True, False), ("when-job", False, True),
    ("unless-noargs", True, True), ("unless-noargs", False, False),
])
def test_skip_when_and_unless(mode, flag, runs):
    limit_jobs.Skipper(mode, flag).dispatch()
    assert work() == ["DONE" if runs else "SKIPPED"]
    assert bool(limit_jobs.CALLS) == runs
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_skip_rejects_other_conditions():
    with pytest.raises(TypeError, match="bool or a callable"):
        Skip.when("yes")


@pytest.mark.usefixtures("scratch_jobs")
def test_an_unknown_limiter_inside_is_a_configuration_error_not_a_failure(store_alias):
    """GenerateReport's order puts RateLimited inside ThrottlesExceptions."""
    from django_jobguard import RateLimited

    class Misconfigured(limit_jobs.Flaky):
        name = "tests.Misconfigured"

        def middleware(self):
            return [ThrottlesExceptions(3, 60), RateLimited("no-such-limiter")]

    Misconfigured().dispatch()
    assert work() == ["RELEASED"]  # the worker's own retry, with the error recorded
    assert "UnknownLimiterError" in QueuedJob.objects.get().last_error
    assert get_store().throttles() == []


@pytest.mark.usefixtures("scratch_jobs")
def test_a_sync_job_that_saw_an_operators_cancel_leaves_the_circuit_as_it_was(store_alias):
    """A job that sees ``job.cancelled`` and returns (as the docs ask) did not succeed: the
    circuit keeps its count (it was reset as after a success)."""
    from django_jobguard import queue
    from django_jobguard.worker.pipeline import Pipeline

    runs: list[str] = []

    class Cancellable(Job):
        name = "tests.throttles.Cancellable"
        tries, backoff = 5, 0

        def middleware(self):
            return [ThrottlesExceptions(max_attempts=3, decay_seconds=60, backoff=0)]

        def handle(self):
            if not runs:
                runs.append("failed")
                raise ConnectionError("service down")  # counted: 1 of 3
            runs.append("cancelled")
            self.context.cancel_seen = True  # what job.cancelled sets once an operator asks
            return None

    Cancellable().dispatch()
    (row,) = queue.claim(["default"], worker_id="w", limit=1, start=1)
    assert Pipeline(worker_id="w").process(row) == "RELEASED"
    key = "jobguard:circuit:" + Cancellable.name
    assert circuit(key).hits == 1
    make_due()
    (row,) = queue.claim(["default"], worker_id="w", limit=1, start=1)
    assert Pipeline(worker_id="w").process(row) == "CANCELLED"
    after = circuit(key)  # (None: reset, as after a success)
    assert after is not None and after.hits == 1
