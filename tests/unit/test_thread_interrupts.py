"""Exceptions raised into a ``--threads`` job's thread (its timeout; a stop: a second Ctrl-C,
``--stop-timeout``) land only in that job's run, never in a completion group the thread then
writes for other jobs (worker/completer.py): a group's statement and the work after each of
its rows' commit (unique lock released, ``job_processed``, DONE) are not cut short, and no
deferred start written by it is taken as unwritten.

Real executor threads, their pipelines and the worker's completion group; the group's
statement is a stand-in (every row still the worker's), the gated job's row is real."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from typing import Any

import pytest

from django_jobguard import Job, queue
from django_jobguard.models import QueuedJob
from django_jobguard.testing import drain
from django_jobguard.worker import timeouts, watchdog
from django_jobguard.worker.completer import Completer, Finished
from django_jobguard.worker.executor import ThreadExecutor, _Stopped
from django_jobguard.worker.pipeline import Pipeline
from tests.support import POSTGRES
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not POSTGRES, reason="batched completion is PostgreSQL's")]

GATED = "tests.interrupts.Gated"
OTHER = "tests.interrupts.Other"


class Dog:
    """The watchdog, not started (a thread's time limit arms it)."""

    def start(self, *args: Any, **kwargs: Any) -> None:
        pass

    def ended(self) -> None:
        pass


class Scene:
    """One executor thread, the worker's completion group, and what happened in them."""

    def __init__(self) -> None:
        #: The gated job's handle() runs, and may return.
        self.handling, self.may_return = threading.Event(), threading.Event()
        #: The thread does the group's work for other jobs (where ``hold_in`` says: its
        #: "statement", or the "callbacks" after its commit), held there until ``gate``.
        self.in_group, self.gate = threading.Event(), threading.Lock()
        self.gate.acquire()
        self.hold_in = "callbacks"
        #: What ran: (step, thread, the time limits armed in that thread then).
        self.steps: list[tuple[str, str, list[str]]] = []
        self.statements: list[tuple[list, list]] = []
        self.states: list[str] = []
        self.limits_in_handle: list[tuple[str, bool]] = []  # (label, time ran out)
        self.pipeline = Pipeline(worker_id="w", log=lambda line, state: None)

    def note(self, step: str) -> None:
        self.steps.append((step, threading.current_thread().name,
                           [limit.label for limit in timeouts.thread_limits(
                               threading.get_ident())]))

    def hold(self, where: str) -> None:
        """The first time the thread gets ``where``: say so, wait for ``gate``."""
        if where == self.hold_in and not self.in_group.is_set():
            self.in_group.set()
            assert self.gate.acquire(timeout=10)
            self.gate.release()

    def acked(self, entry: Finished) -> None:
        """Another job's work after its group's commit (its unique lock, job_processed...)."""
        self.note(f"acked {entry.row.id}: begins")
        self.hold("callbacks")
        self.note(f"acked {entry.row.id}: ends")

    def let_go(self, executor: ThreadExecutor) -> None:
        """Whatever the test reached: nothing held any more, the executor shut down."""
        if self.gate.locked():
            self.gate.release()
        self.may_return.set()
        executor.shutdown()

    def ran_to_their_end(self, others: list[QueuedJob]) -> bool:
        return [step for step, _, _ in self.steps if step.startswith("acked")] == [
            f"acked {row.id}: {part}" for row in others for part in ("begins", "ends")]

    # -- what the executor needs of its worker (executor.Coordinator) -----------------------

    def job_finished(self, state: str, queue: str) -> None:
        self.states.append(state)

    def show_running(self, rows: list[QueuedJob]) -> None:
        pass


class Statement:
    """The group's statement: noted, every row still the worker's."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene

    def complete(self, done, starts, reserved_by, *, relaxed=False):
        self.scene.note("statement")
        self.scene.statements.append(([i for i, _ in done], [i for i, _ in starts]))
        self.scene.hold("statement")
        return {i for i, _ in done}, {i for i, _ in starts}


@pytest.fixture
def scene(scratch_jobs, monkeypatch):
    monkeypatch.setattr(watchdog, "for_this_process", lambda: Dog())
    scene = Scene()

    class Inner(Job):
        name = "tests.interrupts.Inner"
        timeout = 600

        def handle(self):
            scene.note("inner job")

    class Gated(Job):
        """Dispatches a job and runs it with drain() (as a job may), waits for
        ``may_return``, then runs past its 0.05 s timeout (the coordinator ticks only when
        the test says)."""

        name = GATED
        timeout = 0.05

        def handle(self):
            Inner().dispatch(queue="inner")
            assert drain(queue="inner").done == 1
            scene.handling.set()
            assert scene.may_return.wait(10)
            limit = timeouts.thread_limit(threading.get_ident())
            assert limit is not None
            while time.monotonic() < limit.deadline:
                pass
            scene.limits_in_handle.append((limit.label, time.monotonic() >= limit.deadline))

    class Later(Job):
        name = "tests.interrupts.Later"

        def handle(self):
            scene.note("later job")

    scene.Gated, scene.Later = Gated, Later  # type: ignore[attr-defined]
    return scene


def _setup(scene: Scene, *, batch_size: int) -> tuple[ThreadExecutor, Completer,
                                                      list[QueuedJob]]:
    """The worker's group, holding two other jobs that finished (their starts deferred),
    and an executor of one thread sharing it."""
    group = Completer(worker_id="w", using="default", window=60.0, batch_size=batch_size,
                      dialect=Statement(scene))
    group._timer = object()  # type: ignore[assignment]  # no timer thread
    for fast in (GATED, OTHER):  # fast classes: their starts deferred, their acks grouped
        group.ran(fast, 0.001)
    others = []
    for _ in range(2):
        row = QueuedJob(id=uuid.uuid4(), name=OTHER, queue="default",
                        claims=1, attempts=0, reserved_by="w")
        row.attempt_counted, row.recovered = False, False  # claimed ahead, not recovered
        row.held_until = float("inf")  # claimed just now
        assert group.start(row)
        assert group.join(Finished(row, None, None, 0.0, acked=scene.acked,
                                   lost=scene.acked))
        others.append(row)
    scene.pipeline.completer = group
    scene.pipeline.grouped_done = lambda row, state: scene.note(f"grouped {row.name} {state}")
    return ThreadExecutor(scene, 1), group, others


def _claim() -> QueuedJob:
    (row,) = queue.claim(["default"], worker_id="w", limit=1, start=0)
    assert queue.claimed_ahead(row) and row.recovered is False
    return row


@pytest.mark.parametrize("written_at", ["its ack", "the next start"])
def test_no_time_limit_is_armed_in_a_thread_writing_a_group_for_other_jobs(
        scene, monkeypatch, written_at):
    """The group is written by the job's thread as its ack fills it (the timer thread
    writing the group before), or as the thread's next row starts (a class not run here
    yet: its start is written now); the job ran past its timeout, and ran a job of its own
    with drain(). While the thread does the group's work for the other jobs, the
    coordinator's tick raises nothing: a thread's limit is armed only around its job's
    middleware and handle() (drain()'s pipeline has no group), and is left under the lock
    the coordinator raises under, so no timeout is raised after."""
    raised: list[int] = []
    real_raise = timeouts.raise_in_thread

    def noted(ident: int, error: type[BaseException]) -> bool:
        raised.append(ident)
        return real_raise(ident, error)

    monkeypatch.setattr(timeouts, "raise_in_thread", noted)
    executor, group, others = _setup(scene, batch_size=3 if written_at == "its ack" else 100)
    if written_at == "its ack":
        group._writing = True  # the timer thread writes the group before: this one is ours
    scene.Gated().dispatch()  # type: ignore[attr-defined]
    (gated,) = QueuedJob.objects.filter(name=GATED).values_list("id", flat=True)
    try:
        executor.submit(_claim())
        assert scene.handling.wait(10)
        scene.may_return.set()
        if written_at == "the next start":
            wait_for(lambda: scene.states == ["GROUPED"], timeout=10, what="the gated job")
            scene.Later().dispatch()  # type: ignore[attr-defined]
            executor.submit(_claim())
        assert scene.in_group.wait(10)
        (thread,) = [slot.thread for slot in executor._busy]
        executor.tick()  # the coordinator, while the thread works for the others
        assert timeouts.thread_limits(thread.ident or 0) == [] and raised == []
        scene.gate.release()
        wait_for(lambda: executor.busy == 0, timeout=10, what="the jobs ended")
    finally:
        scene.let_go(executor)
    [(label, ran_out)] = scene.limits_in_handle
    assert label.startswith(GATED) and ran_out  # its time was up as it returned
    assert scene.ran_to_their_end(others)
    written = [(step, thread, limits) for step, thread, limits in scene.steps
               if step == "statement" or step.startswith(("acked", "grouped"))]
    assert {thread for _, thread, _ in written} == {"jobguard-executor-1"}
    assert all(limits == [] for _, _, limits in written)
    assert [step for step, _, _ in written if step.startswith("grouped")] == [
        f"grouped {GATED} DONE"]
    [inner] = [limits for step, _, limits in scene.steps if step == "inner job"]
    assert len(inner) == 2  # drain()'s job ran inside the gated one, under both limits
    [(done, starts)] = scene.statements  # the others' acks, the gated job's (and a start)
    assert done == [row.id for row in others] + [gated]
    assert len(starts) == (0 if written_at == "its ack" else 1)


def _waiting_in(ident: int, function: str) -> bool:
    """Whether the thread ``ident`` runs ``function`` now (somewhere in its stack)."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("lands_in", ["statement", "callbacks"])
def test_a_stop_raised_as_a_job_ends_lands_in_its_run_not_in_a_group_for_others(
        scene, monkeypatch, lands_in):
    """A second Ctrl-C (or ``--stop-timeout``) finds the job interruptible, but its thread
    goes on before the stop is raised (the GIL passed to it in between): its job returned,
    and its ack filled a group that it writes for other jobs. Before, the stop landed there:
    in the statement (the group's rows then finished by no one: their unique locks left
    taken, no job_processed, no DONE; its deferred starts taken as not written) or in the
    work after the commit (another job's cut short). Now the job's run ends under the lock
    the stop is raised under: the stop lands in the run, the job goes back to the queue
    with its attempt unused, and the group's work for the others runs to its end."""
    scene.hold_in = lands_in
    real_raise = timeouts.raise_in_thread

    def late(ident: int, error: type[BaseException]) -> bool:
        scene.may_return.set()  # the thread goes on between the check and the raise
        # Until it writes the group (before), or waits at its run's end for the lock this
        # is called under (now: it can go no further until the stop is raised).
        wait_for(lambda: scene.in_group.is_set() or _waiting_in(ident, "_run_ended"),
                 timeout=10, what="the thread in the group or at its run's end")
        try:
            return real_raise(ident, error)
        finally:
            scene.gate.release()

    monkeypatch.setattr(timeouts, "raise_in_thread", late)
    executor, group, others = _setup(scene, batch_size=3)
    scene.Gated().dispatch()  # type: ignore[attr-defined]
    (gated,) = QueuedJob.objects.filter(name=GATED).values_list("id", flat=True)
    try:
        executor.submit(_claim())
        assert scene.handling.wait(10)
        group._writing = True  # the timer thread writes the group before: a full one is ours
        executor.abort(_Stopped)
        wait_for(lambda: executor.busy == 0, timeout=10, what="the stopped job ended")
    finally:
        scene.let_go(executor)
    group._writing = False
    group.flush()  # what is left (the worker's close())
    assert scene.ran_to_their_end(others)
    assert scene.statements == [([row.id for row in others], [])]  # written once, not it
    row = QueuedJob.objects.get(id=gated)  # back in the queue, its attempt unused
    assert row.reserved_by == "" and row.attempts == 0
    assert scene.states == ["RELEASED"]
