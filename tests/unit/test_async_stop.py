"""A stop at once (a second Ctrl-C, ``--stop-timeout``: ``aio.stop_all()``) or an operator's
cancel that comes after an async job's ``handle()`` returned does not cut its middleware's
clean-up short: the job is done and is acked as such, not put back to run again (nor
recorded as cancelled), as for a sync job."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_jobguard import Job, aio, queue
from django_jobguard.context import JobContext
from django_jobguard.middleware import JobMiddleware
from django_jobguard.models import QueuedJob
from django_jobguard.worker.pipeline import Pipeline

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("loop_connections")]

RUNS: list[str] = []
CLEANING = threading.Event()


class SlowCleanUp(JobMiddleware):
    """An async middleware whose clean-up awaits (a store write, a metric flush)."""

    def handle(self, job, next):
        return next(job)

    async def ahandle(self, job, next):
        result = await next(job)
        CLEANING.set()
        await asyncio.sleep(0.5)
        return result


@pytest.fixture
def cleaned(scratch_jobs):
    class Cleaned(Job):
        name = "tests.async_stop.Cleaned"
        timeout = 30

        def middleware(self):
            return [SlowCleanUp()]

        async def handle(self):
            RUNS.append(self.job_id)
            return "ok"

    return Cleaned


def _run_to_the_middleware(job_class):
    """Dispatch and claim a ``job_class`` job and run it on the worker's loop until its
    middleware's clean-up (or error path) begins: its handle, and the run's future."""
    CLEANING.clear()
    handle = job_class().dispatch()
    pipeline = Pipeline(worker_id="w-stop", event_loop=True)
    (row,) = queue.claim(["default"], worker_id="w-stop", limit=1, start=1)
    future = aio.loop_thread().submit(pipeline.aprocess(row))
    assert CLEANING.wait(5)  # handle() ended; the middleware goes on
    return handle, future


def test_a_stop_at_once_after_handle_returned_acks_the_job(cleaned):
    RUNS.clear()
    handle, future = _run_to_the_middleware(cleaned)
    aio.stop_all()
    assert future.result(timeout=10) == "DONE"
    assert [handle.id] == RUNS
    assert not QueuedJob.objects.filter(id=handle.id).exists()  # not back: it ran


def test_a_cancel_after_handle_returned_lets_the_clean_up_end():
    context = JobContext(job_id="1")

    async def job():
        context.handle_finished = True  # as the middleware chain marks it
        await asyncio.sleep(0.2)  # the clean-up
        return "ok"

    async def main():
        running = asyncio.ensure_future(aio.run_job(context, job(), timeout=0, label="c"))
        await asyncio.sleep(0.05)
        (run,) = aio.running()
        run.cancel(aio.CANCELLED)
        return await running, run.reason

    assert aio.loop_thread().run(main()) == ("ok", None)


def test_a_cancel_marks_the_run_s_context_with_its_reason():
    """The reason stays on the run's context (``cut_short``) after the job caught the
    cancellation, for its middleware to read once the task is no longer tracked."""
    context = JobContext(job_id="1")

    async def job():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "swallowed"

    async def main():
        running = asyncio.ensure_future(aio.run_job(context, job(), timeout=0, label="c"))
        await asyncio.sleep(0.05)
        (run,) = aio.running()
        assert context.cut_short is None
        run.cancel(aio.CANCELLED)
        await asyncio.wait([running], timeout=10)
        return context.cut_short

    assert aio.loop_thread().run(main()) == aio.CANCELLED


def test_a_stop_after_handle_returned_still_ends_the_wait_after_the_grace_period():
    """A clean-up that never ends (a store call without a timeout) does not hold a stopping
    worker for ever: after the grace period the run ends, counted as done (put back, the
    finished job would run again)."""
    context = JobContext(job_id="1")

    async def job():
        context.handle_finished = context.handle_returned = True  # as the chain marks it
        await asyncio.sleep(3600)  # the clean-up hangs

    async def main():
        running = asyncio.ensure_future(
            aio.run_job(context, job(), timeout=0, label="hung-clean-up", grace=0.2))
        await asyncio.sleep(0.05)
        (run,) = aio.running()
        aio.stop_all()
        done, _ = await asyncio.wait([running], timeout=10)
        run.task.cancel()  # (the test's own clean-up of the task left running)
        return [task.result() for task in done], run.given_up

    assert aio.loop_thread().run(main()) == ([None], True)


class SlowReporting(JobMiddleware):
    """An async middleware whose exception path awaits (an error report to a slow store)."""

    def handle(self, job, next):
        return next(job)

    async def ahandle(self, job, next):
        try:
            return await next(job)
        except Exception:
            CLEANING.set()
            await asyncio.sleep(5)
            raise


@pytest.fixture
def failing(scratch_jobs):
    class Failing(Job):
        name = "tests.async_stop.Failing"
        timeout = 30
        tries = 5

        def middleware(self):
            return [SlowReporting()]

        async def handle(self):
            raise ValueError("the service failed")

    return Failing


def test_a_stop_while_the_middleware_of_a_job_that_raised_outlasts_the_grace(failing,
                                                                           monkeypatch):
    """Its handle() raised: given up after the grace period, it goes back to the queue (it
    is not acked as done)."""
    from django_jobguard.worker import timeouts

    monkeypatch.setattr(timeouts, "GRACE", 0.3)
    handle, future = _run_to_the_middleware(failing)  # handle() raised; it is reported
    runs = aio.running()
    aio.stop_all()
    assert future.result(timeout=10) != "DONE"
    assert QueuedJob.objects.filter(id=handle.id).exists()  # back, to run again
    for run in runs:  # (the test's own clean-up of the task left running)
        run.task.get_loop().call_soon_threadsafe(run.task.cancel)
