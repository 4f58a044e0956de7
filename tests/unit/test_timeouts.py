"""The hard limits a process registers (django_jobguard/worker/timeouts.py): the watchdog is armed
for the earliest of every job running, whether in the main thread or async on the worker's
loop (issue 27 item 2)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from django_jobguard.context import JobContext
from django_jobguard.worker import timeouts, watchdog
from django_jobguard.worker.pipeline import Pipeline


class FakeDog:
    """Records what the watchdog would be armed for."""

    def __init__(self) -> None:
        self.armed: str | None = None
        self.seconds = 0.0

    def start(self, deadline: float, seconds: float, label: str, *, slack: float) -> None:
        self.armed, self.seconds = label, seconds

    def ended(self) -> None:
        self.armed = None


@pytest.fixture
def dog(monkeypatch):
    fake = FakeDog()
    monkeypatch.setattr(watchdog, "for_this_process", lambda: fake)
    monkeypatch.setattr(timeouts, "_armed", None)
    return fake


def test_the_watchdog_is_armed_for_the_earliest_hard_limit_of_the_jobs_running(dog):
    with timeouts.watched(30, "long"):
        assert dog.armed == "long" and dog.seconds == pytest.approx(timeouts.hard_limit(30),
                                                                     abs=1)
        with timeouts.watched(2, "short"):  # an async job starting beside it
            assert dog.armed == "short"
        assert dog.armed == "long"  # the short one ended: the long one is watched again
        with timeouts.watched(0, "untimed"):  # no timeout, no hard limit
            assert dog.armed == "long"
    assert dog.armed is None



def test_the_main_threads_job_has_its_own_slot_beside_the_async_ones(dog):
    """The main thread's job (under SIGALRM) arms the watchdog itself when it is the only
    job (the solo worker's every job: no registration), and still counts beside async jobs
    and inside another main-thread job (``dispatch_sync()`` in a job)."""
    with timeouts.time_limit(30, label="main"):
        assert dog.armed == "main" and dog.seconds == pytest.approx(timeouts.hard_limit(30),
                                                                     abs=1)
        assert not timeouts._limits  # nothing registered for it
        with timeouts.watched(2, "async"):  # earlier: the async job is watched
            assert dog.armed == "async"
            with timeouts.time_limit(1, label="inner"):  # earlier still
                assert dog.armed == "inner"
            assert dog.armed == "async"
        assert dog.armed == "main"
        with timeouts.watched(60, "later async"):  # later: the main job stays armed
            assert dog.armed == "main"
        assert dog.armed == "main"
    assert dog.armed is None
    with timeouts.watched(60, "async"):
        with timeouts.time_limit(30, label="main"):
            assert dog.armed == "main"
        assert dog.armed == "async"  # the main job ended: the async one is armed again
    assert dog.armed is None and timeouts._main_limit is None
    with timeouts.time_limit(10, label="outer"):  # drain() in a job: a later inner limit
        with timeouts.time_limit(600, label="inner"):
            assert dog.armed == "outer"  # the outer job still ends with its own limit
            with timeouts.watched(2, "async"):
                assert dog.armed == "async"
            assert dog.armed == "outer"
        assert dog.armed == "outer"
    assert dog.armed is None and timeouts._main_limit is None


def test_only_the_main_threads_job_arms_with_the_watchdogs_slack(dog):
    """The slack (a deadline armed at most ``SLACK`` earlier is kept) is for the main
    thread's job only, whose process SIGALRM ends at its grace period anyway; an async job
    and an executor thread's job, given up at their grace period while the worker goes on,
    keep the whole margin after that (a loop stalled for 0.9 s around an async job's give-up
    killed the worker with the slack)."""
    slacks = []
    dog.start = lambda deadline, seconds, label, slack: slacks.append((label, slack))
    with timeouts.time_limit(30, label="main"):
        pass
    with timeouts.watched(30, "async"):
        pass
    done = threading.Event()

    def in_a_thread():
        timeouts.enforce_in_this_thread()  # an executor thread
        with timeouts.time_limit(30, label="thread"):
            pass
        done.set()

    threading.Thread(target=in_a_thread).start()
    assert done.wait(10)
    assert slacks == [("main", watchdog.SLACK), ("async", 0.0), ("thread", 0.0)]


def test_a_job_run_inside_another_in_an_executor_thread_keeps_the_outer_ones_limit(dog):
    """``drain()`` in a job on a ``--threads`` worker: the inner job's limit replaced the
    outer one's, which had neither a timeout nor a hard limit once the inner job ended."""
    seen = {}
    done = threading.Event()

    def in_a_thread():
        timeouts.enforce_in_this_thread()
        ident = threading.get_ident()
        with timeouts.time_limit(10, label="outer"):
            outer = timeouts.thread_limit(ident)
            with timeouts.time_limit(600, label="inner"):
                seen["inner"] = (timeouts.thread_limit(ident).label, dog.armed)
            seen["after"] = (timeouts.thread_limit(ident) is outer, dog.armed)
            with timeouts.time_limit(600, label="given up"):
                timeouts.abandon(timeouts.thread_limit(ident))  # the executor gave it up
                seen["abandoned"] = dog.armed  # and so the job it runs inside
        seen["end"] = (timeouts.thread_limit(ident), dog.armed)
        done.set()

    threading.Thread(target=in_a_thread).start()
    assert done.wait(10)
    assert seen == {"inner": ("inner", "outer"),  # the outer one is still the earliest
                    "after": (True, "outer"), "abandoned": None, "end": (None, None)}


def test_a_timeout_raised_into_a_thread_holding_the_limits_lock_does_not_deadlock():
    """The timeout's message is made in the thread it lands in, which may hold the limits'
    lock just then (leaving its limit): it reads the limit without the lock."""
    made = []

    def in_a_thread():
        with timeouts._limits_lock:
            made.append(str(timeouts.ThreadTimeoutError()))

    thread = threading.Thread(target=in_a_thread, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and made == ["The job has timed out."]

def test_an_async_run_of_a_worker_arms_the_hard_limit_and_drain_does_not(dog):
    """A worker's pipeline (``hard_limits``, a jobworker's main thread) arms the watchdog
    around an async job's run; one without (``drain()``, inline mode) does not."""
    seen: list[str | None] = []

    class Job:  # what run_on_loop needs of a job: its context, middleware and handle()
        def __init__(self) -> None:
            self.context = JobContext(job_id="1")
            self.context.policy = SimpleNamespace(timeout=3)

        def middleware(self) -> list:
            return []

        async def handle(self) -> str:
            seen.append(dog.armed)
            return "done"

    def run(hard_limits: bool) -> str:
        pipeline = Pipeline(worker_id="w")
        pipeline.hard_limits = hard_limits
        row = SimpleNamespace(name="tests.Async", id=1)
        return asyncio.run(pipeline.run_on_loop(row, Job()))

    assert run(True) == "done" and run(False) == "done"
    assert seen == ["tests.Async [1]", None]
    assert dog.armed is None


def _spin(seconds: float) -> None:
    """Busy Python bytecode (a signal handler runs between two of them)."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_timer_left_by_a_longer_job_is_brought_forward_for_a_shorter_one(dog):
    """The interval timer is re-armed lazily: a job that ended leaves it set, and the next
    job re-arms it only when it must fire sooner."""
    import time

    with timeouts.time_limit(30, label="long"):
        pass
    assert timeouts._timer.at is not None  # left set, as the docstring says
    started = time.monotonic()
    with pytest.raises(timeouts.JobTimeoutError), timeouts.time_limit(0.2, label="short"):
        _spin(5)
    assert time.monotonic() - started < 2  # the 30 s timer was brought forward


def test_an_alarm_set_for_an_earlier_job_does_not_end_the_next_one_early(dog):
    """The timer a short job left fires during a longer job: the handler finds that job's
    time not up, sets the timer for the rest, and raises only at the job's own timeout."""
    import time

    with timeouts.time_limit(0.1, label="first"):
        pass  # leaves the timer set for 0.1 s from its start
    started = time.monotonic()
    with pytest.raises(timeouts.JobTimeoutError), timeouts.time_limit(0.6, label="second"):
        _spin(5)
    assert time.monotonic() - started >= 0.59
    # After the grace period was set by the timeout, no job runs: a late alarm ends nothing.
    signal_module = __import__("signal")
    signal_module.setitimer(signal_module.ITIMER_REAL, 0)
    timeouts._timer.at = None


def test_a_timer_left_set_ends_nothing_when_no_job_has_a_limit(dog):
    with timeouts.time_limit(0.05, label="quick"):
        pass
    _spin(0.3)  # the left timer fires here: no job has a limit, so nothing is raised
    assert timeouts._timer.at is None  # it fired, and set nothing again


def test_a_forked_child_sets_its_own_timer(dog):
    """Interval timers are not inherited by fork(): a child whose parent left one set must
    set its own for its first job."""
    import os

    with timeouts.time_limit(1.0, label="parent's"):
        pass
    assert timeouts._timer.at is not None  # due before the child's deadline below
    pid = os.fork()
    if pid == 0:  # the child: its job must time out although the parent's timer was left
        code = 1
        try:
            with timeouts.time_limit(1.5, label="child's"):
                _spin(4)
        except timeouts.JobTimeoutError:
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_job_that_changes_the_alarm_handler_gets_no_late_alarm(dog):
    """A job that put back the default SIGALRM action (which ends the process) must not get
    the timer left set for it: leaving its limit stops the timer."""
    import signal

    try:
        with timeouts.time_limit(0.05, label="resets the handler"):
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        assert timeouts._timer.at is None
        _spin(0.2)  # would have been killed by the left timer
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def test_a_forked_child_inherits_no_hard_limit_of_its_parent(dog):
    """A job that forks: the child's watchdog is its own, so the parent's limits (and
    ``_armed``, which would keep the child from arming it) are not the child's."""
    import os

    with timeouts.time_limit(30, label="parent"):
        assert timeouts._armed is not None
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            ok = (timeouts._main_limit is None and timeouts._armed is None
                  and not timeouts._limits and not timeouts._limits_lock.locked())
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
        os.close(write)
        assert os.read(read, 1) == b"1"
        os.waitpid(pid, 0)
        assert timeouts._main_limit is not None  # the parent's own are untouched


def _in_an_executor_thread(body) -> dict:
    out: dict = {}
    done = threading.Event()

    def run():
        timeouts.enforce_in_this_thread()
        try:
            body(out)
        finally:
            timeouts.forget_thread_limit()
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(20)
    return out


def test_an_outer_jobs_timeout_is_raised_while_a_job_it_runs_inside_runs(dog):
    """``drain()`` in a job on a ``--threads`` worker: the outer job's time runs out while
    an inner one (a longer timeout) runs; the coordinator raises it (not only the watchdog's
    kill of the whole process at the outer's hard limit)."""
    import time

    inner_runs, expired = threading.Event(), []

    def tick():  # the coordinator's
        assert inner_runs.wait(10)
        time.sleep(0.1)  # the outer job's 0.05 s are up
        expired.extend(limit.label for limit in timeouts.expire_thread_limits({ident[0]}))

    ident = []
    ticking = threading.Thread(target=tick)
    ticking.start()

    def body(out):
        ident.append(threading.get_ident())
        with timeouts.time_limit(0.05, label="outer"):
            try:
                with timeouts.time_limit(600, label="inner"):
                    inner_runs.set()
                    for _ in range(500):
                        time.sleep(0.01)  # the timeout lands here
            except timeouts.ThreadTimeoutError:
                out["raised"] = True
            out["limits"] = [limit.label for limit in timeouts.thread_limits(ident[0])]

    assert _in_an_executor_thread(body) == {"raised": True, "limits": ["outer"]}
    ticking.join(10)
    assert expired == ["outer"]


def test_a_job_leaving_its_limit_drops_those_left_by_jobs_it_ran_inside(dog):
    """An inner job's clean-up cut short by its timeout leaves its limit registered: the
    job it ran inside drops it with its own as it ends (it came back for the rest of that
    job before, and the watchdog stayed armed for it)."""
    kept = []

    def body(out):
        ident = threading.get_ident()
        with timeouts.time_limit(30, label="outer"):
            inner = timeouts._thread_limit(0.05, lambda: True, "inner")
            inner.__enter__()  # never left (kept: its generator's clean-up never runs)
            kept.append(inner)
            out["stale"] = [limit.label for limit in timeouts.thread_limits(ident)]
        out["after"] = (timeouts.thread_limits(ident), dog.armed)

    assert _in_an_executor_thread(body) == {"stale": ["inner", "outer"], "after": ([], None)}
