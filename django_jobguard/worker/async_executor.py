"""The worker's async executor: claimed rows of async jobs run on this process's event loop.

``jobworker --async-concurrency N`` runs up to N async jobs at once on the loop of
:func:`django_jobguard.aio.loop_thread`; the worker loop hands it rows as it hands sync rows to
:class:`~django_jobguard.worker.executor.ThreadExecutor`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from django_jobguard.aio import loop_thread, stop_all

if TYPE_CHECKING:
    from django_jobguard.worker.prefetch import Prefetch

logger = logging.getLogger("django_jobguard.worker")


def _slot_ended(future: asyncio.Future[None] | concurrent.futures.Future[None]) -> None:
    """A slot's task ended: anything but a cancellation (the loop closing) is a bug, logged."""
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        logger.error("An async slot ended with an error.", exc_info=exc)

class AsyncExecutor:
    """Runs claimed rows of async jobs on this process's loop, up to ``concurrency`` at once
    (``jobworker --async-concurrency``). ``pipeline`` begins each row in the calling thread
    (the worker's coordinator: start and rebuild, no round trip for a row its claim started)
    and completes it on the loop (``acomplete``: the job, then its outcome applied off the
    loop). ``finished(row, state)`` is called as each ends with the state logged, or ``None``
    when a database or store error left the row to lease recovery."""

    def __init__(self, pipeline: Any, concurrency: int,
                 finished: Callable[[Any, str | None], None]) -> None:
        if concurrency < 1:
            raise ValueError(f"async concurrency must be at least 1, not {concurrency}.")
        self.pipeline, self.concurrency, self.finished = pipeline, concurrency, finished
        self._slots = threading.Semaphore(concurrency)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        #: Each running row by id, with its start (``time.monotonic()``): one dict, not two,
        #: since every job's end looks both up (a UUID's hash is a Python call).
        self._rows: dict[Any, tuple[Any, float]] = {}
        self._next: dict[Any, Any] = {}  # a running row's id: the buffered row run after it
        #: Rows claimed ahead (:mod:`~django_jobguard.worker.prefetch`): a job that ends
        #: hands its slot to the next async row there, started on the loop at once.
        self.prefetch: Prefetch | None = None

    def submit(self, row: Any, *, stop: threading.Event | None = None) -> bool:
        """Start ``row`` once a slot is free; False (not started) if ``stop`` was set while
        waiting for one."""
        while not self._slots.acquire(timeout=0.2):
            if stop is not None and stop.is_set():
                return False
        started = time.monotonic()
        with self._lock:
            self._rows[row.id] = (row, started)
        try:
            job = self.pipeline.begin(row, started)
        except BaseException as exc:
            failed: concurrent.futures.Future[str] = concurrent.futures.Future()
            failed.set_exception(exc)
            self._done(row, failed)
            return True
        if isinstance(job, str):  # ended before it ran (lost, failed, cancelled, ...)
            done: concurrent.futures.Future[str] = concurrent.futures.Future()
            done.set_result(job)
            self._done(row, done)
            return True
        loop_thread().spawn(
            self._slot(row, self.pipeline.acomplete(row, job, started, then=self._then(row))),
            _slot_ended)
        return True

    async def _slot(self, row: Any, run: Coroutine[Any, Any, str]) -> None:
        """On the loop: ``run`` (``row``'s job), then each buffered row that takes its slot,
        one after another in this one task (not a task made, and ended, per job)."""
        while True:
            state: str | None = None
            try:
                state = await run
            except BaseException as exc:  # as a done callback saw it: the slot goes on
                logger.error("Error while finishing %s; if it was not acked its lease will "
                             "expire and it will be retried.", row, exc_info=exc)
            following = self._end(row, state)
            if following is None:
                return
            row, run = following, self.pipeline.aprocess(following, then=self._then(following))

    def _then(self, row: Any) -> Callable[[], Any] | None:
        """What ``row``'s pipeline asks, as its outcome is written, for the row that takes
        its slot next (the ack starts it in the same round trip)."""
        if self.prefetch is None:
            return None

        def take() -> Any:
            with self._lock:
                if row.id in self._next:
                    return self._next[row.id]
                if self.prefetch is None or self.pipeline.stopping():
                    return None
                following = self.prefetch.take(is_async=True)
                if following is not None:
                    self._next[row.id] = following
                return following

        return take

    def _done(self, row: Any, future: concurrent.futures.Future[str]) -> None:
        """A row that ended as it began (in the coordinator): its slot goes on with the
        next buffered row, on the loop."""
        state: str | None = None
        try:
            state = future.result()
        except BaseException as exc:
            logger.error("Error while finishing %s; if it was not acked its lease will expire "
                         "and it will be retried.", row, exc_info=exc)
        following = self._end(row, state)
        if following is not None:  # its slot, kept: started on the loop (begun off it)
            loop_thread().spawn(
                self._slot(following, self.pipeline.aprocess(following,
                                                             then=self._then(following))),
                _slot_ended)

    def _end(self, row: Any, state: str | None) -> Any:
        """``row`` ended with ``state`` (``None``: an error left it to lease recovery): the
        row that takes its slot, or ``None`` once the slot is freed."""
        following = self._following(row)
        if following is None:
            with self._lock:
                self._rows.pop(row.id, None)
                self._idle.notify_all()
            self._slots.release()
        try:
            self.finished(row, state)
        except Exception:
            logger.exception("Recording the end of %s failed.", row)
        return following

    def _following(self, row: Any) -> Any:
        """The async row that takes ``row``'s slot, from the prefetch buffer (then running,
        its lease renewed as such), or ``None`` (the slot is freed)."""
        prefetch = self.prefetch
        with self._lock:
            running = self._rows.get(row.id)
            following = self._next.pop(row.id, None)  # taken as its outcome was written
            if prefetch is None:
                return None
            if running is not None:
                prefetch.finished(time.monotonic() - running[1])
            if following is None and not self.pipeline.stopping():
                following = prefetch.take(is_async=True)
            if following is None:
                return None
            self._rows.pop(row.id, None)
            self._rows[following.id] = (following, time.monotonic())
            return following

    def free(self) -> int:
        """How many more async jobs may start now."""
        with self._lock:
            return self.concurrency - len(self._rows)

    def held(self) -> frozenset[Any]:
        """Ids of the rows running now, and of those taken to run next (the heartbeat
        renews their leases)."""
        with self._lock:
            return frozenset(self._rows) | {row.id for row in self._next.values()}

    def __len__(self) -> int:
        """How many async jobs run now, and rows taken to run next in their slots."""
        with self._lock:
            return len(self._rows) + len(self._next)

    def stop_all(self) -> None:
        """Cancel every running job's task (the worker stops at once): each goes back to the
        queue without using an attempt."""
        stop_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no job runs; False if some still did after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._rows:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left if left is not None else 1.0)
        return True
