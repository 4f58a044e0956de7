"""The worker pipeline, in-process: outcomes, attempts, backoff, failures, bad input."""

from __future__ import annotations

import datetime
import time

import pytest
from demo.models import Profile
from django.db.models import F
from django.utils import timezone

from django_jobguard import Job, signals
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.worker import RecentOutcomes, Worker, WorkerOptions
from tests.support import jobs, make_due, requires_postgres, work

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clear_calls():
    jobs.CALLS.clear()


def test_success_deletes_the_row_and_sends_signals():
    seen = []
    def recorder(name):
        return lambda **kw: seen.append((name, kw.get("job_id")))

    receivers = {name: recorder(name) for name in ("job_processing", "job_processed")}
    for name, fn in receivers.items():
        getattr(signals, name).connect(fn)
    try:
        handle = jobs.Noop(3).dispatch()
        assert work() == ["DONE"]
    finally:
        for name, fn in receivers.items():
            getattr(signals, name).disconnect(fn)
    assert not QueuedJob.objects.exists()
    assert seen == [("job_processing", handle.id), ("job_processed", handle.id)]


def test_exception_retries_with_backoff_then_fails_with_the_real_exception():
    jobs.Boom("kaput").dispatch()
    assert work() == ["RELEASED"]
    row = QueuedJob.objects.get()
    assert row.attempts == 1 and row.exceptions == 1 and "kaput" in row.last_error
    make_due()
    assert work() == ["RELEASED"]
    make_due()
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get()
    assert failed.exception_class == "builtins.RuntimeError"
    assert failed.message == "kaput" and "Traceback" in failed.traceback
    assert failed.attempts == 3
    assert jobs.CALLS == [("boom", 1), ("boom", 2), ("boom", 3)]


def test_backoff_list_is_per_attempt_and_the_last_value_repeats():
    class Backoff(jobs.Boom):
        name = "tests.Backoff"
        tries = 4
        backoff = [10, 100]

    Backoff().dispatch()
    delays = []
    for _ in range(3):
        before = timezone.now()
        work()
        row = QueuedJob.objects.get()
        delays.append(round((row.available_at - before).total_seconds(), -1))
        make_due()
    assert delays == [10, 100, 100]


def test_unlimited_tries_and_max_exceptions():
    class Unlimited(jobs.Boom):
        name = "tests.Unlimited"
        tries = 0
        max_exceptions = 4

    Unlimited().dispatch()
    states = []
    for _ in range(4):
        states += work()
        make_due()
    assert states == ["RELEASED"] * 3 + ["FAILED"]


def test_release_counts_an_attempt_and_fails_at_pop_with_max_attempts_exceeded():
    jobs.ReleaseMe().dispatch()
    assert work() == ["RELEASED", "RELEASED", "FAILED"]  # release(0) is due again at once
    failed = FailedJob.objects.get()
    assert failed.exception_class.endswith("MaxAttemptsExceededError")
    assert failed.message == ("tests.support.jobs.ReleaseMe has been attempted too many times: "
                              "2 of 2 tries used.")
    assert failed.reason == "2 of 2 tries used"
    assert jobs.CALLS == [("release", 1), ("release", 2)]  # the third pop never ran it


def test_max_attempts_message_keeps_the_last_real_error():
    class Flaky(jobs.Boom):
        name = "tests.Flaky"
        tries = 1

    Flaky("first").dispatch()
    QueuedJob.objects.update(last_error="builtins.RuntimeError: earlier", attempts=1)
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get()
    assert failed.message.endswith("1 of 1 tries used; last error: RuntimeError: earlier.")
    assert failed.last_error == "builtins.RuntimeError: earlier"  # the job's own, as it was


def test_defer_does_not_use_attempts():
    jobs.DeferMe(3).dispatch()
    for _ in range(4):
        work()
        make_due()
    assert not FailedJob.objects.exists()
    assert jobs.CALLS == [("defer", 1)] * 4  # attempts stay at 1, tries=1 never runs out


def test_defer_counts_when_the_setting_says_so(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "DEFERRALS_CONSUME_ATTEMPTS": True}
    jobs.DeferMe(3).dispatch()
    assert work() == ["RELEASED", "FAILED"]


def test_retry_until_overrides_tries():
    class Deadline(jobs.Boom):
        name = "tests.Deadline"
        tries = 1

        def retry_until(self):
            return timezone.now() + datetime.timedelta(hours=1)

    Deadline().dispatch()
    for _ in range(5):
        assert work() == ["RELEASED"]
        make_due()
    QueuedJob.objects.update(payload={"args": [], "kwargs": {},
                                      "retry_until": timezone.now().isoformat()})
    assert work() == ["FAILED"]
    assert FailedJob.objects.get().exception_class.endswith("MaxAttemptsExceededError")


def test_fail_is_final():
    jobs.FailMe().dispatch()
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get()
    assert failed.exception_class.endswith("ManuallyFailedError")
    assert failed.message == "no point retrying"


def test_timeout_interrupts_the_job_and_counts_as_an_attempt():
    jobs.Slow(5).dispatch()
    assert work() == ["RELEASED"]
    row = QueuedJob.objects.get()
    assert row.attempts == 1 and "JobTimeoutError" in row.last_error
    make_due()
    assert work() == ["FAILED"]
    assert FailedJob.objects.get().exception_class.endswith("JobTimeoutError")


def test_fail_on_timeout():
    class FailFast(jobs.Slow):
        name = "tests.FailFast"
        fail_on_timeout = True

    FailFast(5).dispatch()
    assert work() == ["FAILED"]


def test_unknown_job_goes_to_failed_jobs_and_the_worker_goes_on():
    # Queued before UNKNOWN_JOB_GRACE (10 min): no newer worker took it, so it fails.
    QueuedJob.objects.create(name="gone.Removed", payload={"args": [], "kwargs": {}},
                             created_at=timezone.now() - datetime.timedelta(minutes=11))
    jobs.Noop().dispatch()
    assert sorted(work()) == ["DONE", "FAILED"]
    failed = FailedJob.objects.get()
    assert failed.name == "gone.Removed"
    assert "No job is registered as 'gone.Removed'" in failed.message


@pytest.mark.parametrize("payload", [[1, 2], {"args": "nope"}, {"args": [{"__jobguard__": "?"}]}])
def test_corrupt_payload_goes_to_failed_jobs(payload):
    # Arguments the class does not take ({"kwargs": {"surprise": 1}}) are another version's
    # row and wait like an unknown job (tests/unit/test_pipeline.py, issue 30 item 2).
    QueuedJob.objects.create(name="tests.support.jobs.Noop", payload=payload)
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get()
    assert "payload" in failed.message.lower()


def test_arguments_the_class_does_not_take_fail_past_the_grace(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "UNKNOWN_JOB_GRACE": 0}
    QueuedJob.objects.create(name="tests.support.jobs.Noop",
                             payload={"args": [], "kwargs": {"surprise": 1}})
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get()
    assert "unexpected keyword argument 'surprise'" in failed.message
    assert failed.exception_class == "django_jobguard.registry.IncompatibleJobError"


def test_missing_model_fails_with_reason_or_is_deleted():
    profile = Profile.objects.create(name="gone")
    jobs.SyncProfileById(profile).dispatch()
    jobs.DropWhenMissing(profile).dispatch()
    profile.delete()
    assert sorted(work()) == ["DELETED", "FAILED"]
    failed = FailedJob.objects.get()
    assert failed.name == "tests.support.jobs.SyncProfileById"
    assert "Profile with pk=" in failed.message and "no longer exists" in failed.message
    assert not QueuedJob.objects.exists()


def test_crashed_worker_job_comes_back_after_its_lease_with_the_attempt_counted():
    jobs.Noop().dispatch()
    QueuedJob.objects.update(attempts=1, reserved_at=timezone.now(), reserved_by="dead:1",
                             available_at=timezone.now() + datetime.timedelta(seconds=90))
    assert work() == []  # still leased
    QueuedJob.objects.update(available_at=timezone.now() - datetime.timedelta(seconds=1))
    jobs.Noop.tries = 2
    try:
        assert work() == ["DONE"]
    finally:
        jobs.Noop.tries = None


def test_crash_recovery_respects_tries():
    jobs.Noop().dispatch()
    QueuedJob.objects.update(attempts=1, reserved_at=timezone.now(), reserved_by="dead:1")
    assert work() == ["FAILED"]
    assert FailedJob.objects.get().exception_class.endswith("MaxAttemptsExceededError")


def test_priority_then_age_then_queue_order():
    for n, priority in [(1, 0), (2, 5), (3, 0), (4, -5)]:
        jobs.Noop(n).dispatch(priority=priority)
    jobs.Noop(9).dispatch(queue="high")
    order = []
    signals.job_processed.connect(rec := lambda **kw: order.append(kw["result"]))
    try:
        work(queues=("high", "default"))
    finally:
        signals.job_processed.disconnect(rec)
    assert order == [9, 2, 1, 3, 4]


def test_star_runs_every_queue_not_named_after_the_named_ones_and_skips_paused_ones():
    from django_jobguard import operations

    jobs.Noop(1).dispatch(queue="mail")
    jobs.Noop(2).dispatch(queue="reports")
    jobs.Noop(3).dispatch(queue="high")
    jobs.Noop(4).dispatch(queue="held")
    operations.pause("held")
    order = []
    signals.job_processed.connect(rec := lambda **kw: order.append(kw["result"]))
    try:
        work(queues=("high", "*"))
    finally:
        signals.job_processed.disconnect(rec)
    assert order[0] == 3 and sorted(order[1:]) == [1, 2]
    assert list(QueuedJob.objects.values_list("queue", flat=True)) == ["held"]


def test_star_takes_the_other_queues_in_turn():
    """With a backlog on two queues, ``*`` does not drain one before it starts the other."""
    for n in range(4):
        jobs.Noop(n).dispatch(queue="a")
        jobs.Noop(10 + n).dispatch(queue="b")
    order = []
    signals.job_processed.connect(rec := lambda **kw: order.append(kw["result"]))
    try:
        work(queues=("*",), batch=1)
    finally:
        signals.job_processed.disconnect(rec)
    queues = ["a" if n < 10 else "b" for n in order]
    assert sorted(order) == [0, 1, 2, 3, 10, 11, 12, 13]
    assert queues[:4].count("a") == 2, queues  # alternating, not a, a, a, a, b, ...


def test_star_is_not_a_queue_to_dispatch_to():
    with pytest.raises(ValueError, match="'\\*' is not a queue name"):
        jobs.Noop(1).dispatch(queue="*")
    with pytest.raises(ValueError, match="'a,b' is not a queue name"):
        jobs.Noop(1).dispatch(queue="a,b")


@pytest.mark.parametrize("name", ["a b", "mail\n", "\tx", " ", "q" * 101])
def test_a_queue_name_pause_and_search_would_refuse_is_refused_at_dispatch(name):
    # pause and search refuse a queue name with whitespace (or over 100 characters): a job
    # queued there could be neither paused nor found, so dispatch refuses it too.
    with pytest.raises(ValueError, match=r"is not a queue name: 1 to 100 characters, without "
                                         r"spaces, line breaks or commas"):
        jobs.Noop(1).dispatch(queue=name)
    assert not QueuedJob.objects.exists()


def test_batch_claims_and_max_jobs():
    for n in range(7):
        jobs.Noop(n).dispatch()
    assert work(batch=3, max_jobs=5) == ["DONE"] * 5
    assert QueuedJob.objects.count() == 2
    assert QueuedJob.objects.filter(reserved_at__isnull=False).count() == 0


def test_a_batch_counts_the_attempt_of_each_job_as_it_starts():
    from django_jobguard import queue

    for n in range(3):
        jobs.Noop(n).dispatch()
    rows = queue.claim(["default"], worker_id="w", limit=3, start=1)
    assert [r.attempt_counted for r in rows] == [True, False, False]
    assert sorted(QueuedJob.objects.values_list("attempts", flat=True)) == [0, 0, 1]
    assert queue.start(rows[1]) is True and rows[1].attempts == 1
    assert queue.start(rows[1]) is True and rows[1].attempts == 1  # counted once
    # Given back unstarted (shutdown): nothing to give back, and the row stays at 0.
    assert queue.release(rows[2], count_attempt=False) is True
    assert QueuedJob.objects.get(id=rows[2].id).attempts == 0
    assert QueuedJob.objects.get(id=rows[1].id).attempts == 1


def test_a_job_claimed_ahead_whose_lease_was_lost_is_not_started():
    from django_jobguard import queue

    jobs.Noop(1).dispatch()
    jobs.Noop(2).dispatch()
    worker = Worker(WorkerOptions(stop_when_empty=True, memory=0))
    first, ahead = queue.claim(["default"], worker_id=worker.id, limit=2, start=1)
    QueuedJob.objects.filter(id=ahead.id).update(reserved_by="someone-else")
    assert worker.process(ahead) == "LOST"
    assert QueuedJob.objects.get(id=ahead.id).attempts == 0
    assert worker.process(first) == "DONE"


def test_jobs_claimed_ahead_by_a_dead_worker_have_their_tries_left():
    from django_jobguard import queue

    for n in range(3):
        jobs.Noop(n).dispatch()
    queue.claim(["default"], worker_id="dead:1", limit=3, start=1)  # then killed
    make_due()  # its lease ran out
    jobs.Noop.tries = 1
    try:
        assert sorted(work()) == ["DONE", "DONE", "FAILED"]  # only the begun one used its try
    finally:
        jobs.Noop.tries = None


def test_lost_lease_is_not_acked():
    handle = jobs.Noop().dispatch()
    worker = Worker(WorkerOptions(stop_when_empty=True))
    from django_jobguard import queue

    (row,) = queue.claim(["default"], worker_id=worker.id)
    QueuedJob.objects.filter(id=handle.id).update(reserved_by="someone-else",
                                                  attempts=F("attempts") + 1)
    assert worker.process(row) == "LOST"
    assert QueuedJob.objects.filter(id=handle.id).exists()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_recent_outcomes_keep_one_bucket_a_second_and_forget_after_the_window():
    clock = FakeClock()
    recent = RecentOutcomes(window=60, clock=clock)
    for n in range(120_000):  # two minutes at 1,000 jobs/s
        clock.now = 1000.0 + n / 1000
        recent.record("FAILED" if n % 100 == 0 else "DONE")
        recent.record("RUNNING")  # not an outcome: not counted
    assert len(recent) == 60  # bounded by the window, not by the jobs
    assert recent.counts() == (59_400, 600)  # the last 60 s only: 60,000 outcomes
    clock.now += 30
    assert recent.counts() == (29_700, 300)
    clock.now += 31
    assert recent.counts() == (0, 0) and len(recent) == 0


class SlowCleanUp:
    """A middleware whose work after ``handle()`` (like releasing a lock in a slow store)
    outlasts the job's timeout."""

    def __init__(self, before: float = 0.0, after: float = 0.0) -> None:
        self.before, self.after = before, after

    def handle(self, job, next):
        time.sleep(self.before)
        result = next(job)
        time.sleep(self.after)
        jobs.CALLS.append(("clean-up done", job.attempts()))
        return result


class TimedMiddlewareJob(Job):
    name = "tests.TimedMiddlewareJob"
    timeout = 0.3
    tries = 1

    def __init__(self, before: float = 0.0, after: float = 0.0):
        self.before, self.after = before, after

    def middleware(self):
        return [SlowCleanUp(self.before, self.after)]

    def handle(self):
        jobs.CALLS.append(("handled", self.attempts()))


def test_the_timeout_does_not_interrupt_middleware_clean_up_after_handle():
    TimedMiddlewareJob(after=0.6).dispatch()
    assert work() == ["DONE"]  # not a timeout: handle() had finished in time
    assert jobs.CALLS == [("handled", 1), ("clean-up done", 1)]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()


def test_the_timeout_still_covers_middleware_before_handle():
    TimedMiddlewareJob(before=0.6).dispatch()
    assert work() == ["FAILED"]
    assert jobs.CALLS == []
    assert FailedJob.objects.get().exception_class.endswith("JobTimeoutError")


def test_the_stop_flag_can_be_set_by_a_handler_that_interrupted_its_wait():
    """A signal handler runs in the main thread, maybe while it holds the flag's lock inside
    ``wait()`` (entered here by hand, as the handler would find it); a plain Event's set()
    would wait for that lock for ever. Checked in a thread so a regression fails, not hangs."""
    import threading

    from django_jobguard.worker import StopFlag

    flag = StopFlag()
    done = threading.Event()

    def interrupted_wait() -> None:
        with flag._cond:  # where wait() holds it between checking the flag and blocking
            flag.set()  # what the handler does
        done.set()

    threading.Thread(target=interrupted_wait, daemon=True).start()
    assert done.wait(10), "set() inside the flag's own lock blocked"
    assert flag.is_set() and flag.wait(0)


def test_a_heartbeat_that_finds_its_row_gone_registers_again(caplog):
    """Issue 27 (3): housekeeping (or an operator) deleted the row of a worker that is alive;
    its next heartbeat writes it again and renews the lease of the job it runs."""
    from django_jobguard import queue
    from django_jobguard.models import Worker as WorkerRow

    handle = jobs.Noop().dispatch()
    worker = Worker(WorkerOptions(queues=["default"], memory=0))
    (row,) = queue.claim(["default"], worker_id=worker.id)
    worker.show_running([row])
    assert not WorkerRow.objects.filter(id=worker.id).exists()
    QueuedJob.objects.filter(id=handle.id).update(available_at=timezone.now())  # lease out

    worker.heartbeat()
    again = WorkerRow.objects.get(id=worker.id)
    assert again.queues == "default" and again.current_job == str(row.id)
    assert QueuedJob.objects.reserved().filter(id=handle.id).exists()  # lease renewed
    assert "registered again" in caplog.text and "still holds 1 of the 1" in caplog.text

    WorkerRow.objects.filter(id=worker.id).delete()
    worker.halted.set()  # shutting down: its row was deleted on purpose
    worker.heartbeat()
    assert not WorkerRow.objects.filter(id=worker.id).exists()


def test_a_worker_started_while_its_database_is_unreachable_registers_once_it_is_back(
        monkeypatch, caplog):
    """Its row cannot be written at first (a database restarting as the worker starts): it
    says so and tries again, then runs as usual, instead of exiting with the error."""
    from django.db import OperationalError
    from django.db.models import QuerySet

    from django_jobguard.worker import loop

    real = QuerySet.update_or_create
    failures = []

    def update_or_create(self, *args, **kwargs):
        if self.model is loop.WorkerRow and len(failures) < 2:
            failures.append("refused")
            raise OperationalError("the database system is starting up")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(loop, "REGISTER_EVERY", 0.01)
    monkeypatch.setattr(QuerySet, "update_or_create", update_or_create)
    jobs.Noop(1).dispatch()
    with caplog.at_level("WARNING", logger="django_jobguard.worker"):
        assert Worker(WorkerOptions(queues=["default"], once=True, sleep=0, memory=0)).run() == 0
    assert failures == ["refused", "refused"] and not QueuedJob.objects.exists()
    assert sum("Could not register worker" in r.getMessage() for r in caplog.records) == 2


@requires_postgres
def test_stop_when_empty_stops_once_the_queue_is_drained_without_waiting_for_a_notify(
        monkeypatch):
    # A claim that gets fewer rows than it asked for tells a LISTENing worker its only queue
    # is drained: it then waits for a NOTIFY (or --sleep) instead of an empty claim. With
    # --stop-when-empty that wait was --sleep seconds spent before every exit.
    for n in range(4):  # claims of 1, 2 and 4 rows (adaptive): the last gets 1
        jobs.Noop(n).dispatch()
    worker = Worker(WorkerOptions(stop_when_empty=True, memory=0, sleep=30))
    waits = []
    monkeypatch.setattr(worker, "_wait", lambda cap=None: waits.append(cap))
    states = []
    worker.pipeline.log = lambda line, state: states.append(state)
    assert worker.run() == 0
    assert worker._listener is not None  # it LISTENed (closed, still set)
    assert [s for s in states if s != "RUNNING"] == ["DONE"] * 4
    assert waits == []
    assert not QueuedJob.objects.exists()
