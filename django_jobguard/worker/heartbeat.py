"""The worker's heartbeat: a thread that keeps the worker's claims and its row alive.

Every ``min(RETRY_AFTER / 3, 15)`` seconds (at least half a second) :meth:`Heartbeat.beat`
runs its steps in turn, each named after its one job:

1. :meth:`~Heartbeat.renew_leases`: the leases of the rows the worker holds (running, and
   claimed ahead or waiting for a slot), so no other worker takes them;
2. :meth:`~Heartbeat.say_alive`: the Worker row's ``last_seen_at``, counts and state, written
   again when housekeeping or an operator deleted it; and what an operator asked of the
   worker through the row (``command``: quiet or stop), which it then does
   (:meth:`~django_jobguard.worker.loop.Worker.obey`): so a command from the admin or the API
   on any host reaches the worker within one beat;
3. :meth:`~Heartbeat.flush_history`: the per-queue, per-minute counts of the dashboard;
4. :meth:`~Heartbeat.tick_schedules`: periodic jobs due now (any worker enqueues each tick,
   once);
5. :meth:`~Heartbeat.housekeeping`: once a minute, the clean-up any live worker may do;
6. :meth:`~Heartbeat.check_objectives`: the queues' latency and failure-rate objectives
   (``QUEUES[q]["max_wait"]``/``["max_failure_rate"]``; one worker signals each crossing).

A step that fails (the database is restarting) is logged and retried at the next beat.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from django.db import connections
from django.db.models.functions import Now

from django_jobguard import logs, operations, queue, schedules, slo
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import Worker as WorkerRow

logger = logging.getLogger("django_jobguard.worker")

#: Seconds between two housekeeping rounds of one worker.
HOUSEKEEPING_EVERY = 60.0


class Beating(Protocol):
    """What the heartbeat needs of its worker (:class:`~django_jobguard.worker.loop.Worker`
    implements it)."""

    id: str
    jobs_processed: int
    @property
    def current_job(self) -> str:
        """The ids of the jobs running now, as the Worker row shows them."""
    #: Set when the worker has stopped: the heartbeat ends.
    halted: threading.Event

    def held_ids(self) -> frozenset[Any]:
        """The rows whose leases the worker holds (running, claimed ahead, waiting)."""

    def recent_counts(self) -> tuple[int, int]:
        """``(done, failed)`` in the last minute."""

    def flush_history(self) -> None:
        """Write the dashboard's per-minute counts gathered since the last call."""

    def identity(self) -> dict[str, Any]:
        """The fields of the Worker row that never change."""

    @property
    def run_state(self) -> str:
        """``running``, ``quiet`` or ``stopping``."""

    def obey(self, command: str) -> None:
        """Do what an operator asked through the Worker row: ``quiet`` or ``stop``."""


class Heartbeat:
    """The heartbeat of ``worker`` (see the module docstring): :meth:`start` its thread,
    which beats until the worker's ``halted`` event is set; :meth:`join` it at shutdown."""

    def __init__(self, worker: Beating, using: str) -> None:
        self.worker = worker
        self.using = using
        self.interval = max(0.5, min(float(jobguard_settings.RETRY_AFTER) / 3, 15.0))
        self._ticker = schedules.Ticker(self.using)
        self._last_clean = time.monotonic()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Beat in a daemon thread of its own."""
        self._thread = threading.Thread(target=self._run, name="jobguard-heartbeat",
                                        daemon=True)
        self._thread.start()

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the thread to end (after the worker's ``halted`` is set)."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        logs.bind_worker(self.worker.id)
        try:
            self._ticker.run_once()  # due ticks at start-up too, not one interval later
            while not self.worker.halted.wait(self.interval):
                try:
                    self.beat()
                except Exception as exc:
                    logger.warning("Heartbeat failed (%s); retrying.", exc)
                    queue.close_broken_connections(all_idle=True)
        finally:
            connections.close_all()

    def beat(self) -> None:
        """One beat: every step in turn."""
        self.keep_alive()
        self.tick_schedules()
        self.housekeeping()
        self.check_objectives()

    def keep_alive(self) -> None:
        """The steps about this worker: its leases, its row, its counts."""
        held, renewed = self.renew_leases()
        self.say_alive(held=held, renewed=renewed)
        self.flush_history()

    # -- the steps ---------------------------------------------------------------------------

    def renew_leases(self) -> tuple[int, int]:
        """Renew the lease of every row the worker holds; ``(held, renewed)`` (a row another
        worker claimed meanwhile is not renewed)."""
        held = self.worker.held_ids()
        renewed = queue.extend_leases(self.worker.id, ids=held, using=self.using) if held else 0
        return len(held), renewed

    def say_alive(self, *, held: int = 0, renewed: int = 0) -> None:
        """Write the Worker row's ``last_seen_at``, counts and state; write the row again if
        it is gone (see :meth:`_register_again`); then do what an operator asked through it
        (its ``command``), reading the row it just wrote: its own, by its unique id."""
        worker = self.worker
        done, failed = worker.recent_counts()
        beat = {"jobs_processed": worker.jobs_processed, "current_job": worker.current_job,
                "done_last_minute": done, "failed_last_minute": failed,
                "state": worker.run_state}
        row = WorkerRow.objects.using(self.using).filter(id=worker.id)
        if not row.update(last_seen_at=Now(), **beat):
            self._register_again(beat, held=held, renewed=renewed)
            return
        command = row.values_list("command", flat=True).first()
        if command:
            worker.obey(command)
            if worker.run_state != beat["state"]:  # shown at once, not a beat later
                row.update(state=worker.run_state)

    def flush_history(self) -> None:
        """Add the jobs finished since the last beat to the dashboard's per-minute counts."""
        self.worker.flush_history()

    def tick_schedules(self) -> None:
        """Enqueue the periodic jobs due now (``SCHEDULE``, ``@periodic``)."""
        self._ticker()

    def housekeeping(self, *, every: float = HOUSEKEEPING_EVERY) -> None:
        """At most every ``every`` seconds: expired locks, workers that stopped beating."""
        if time.monotonic() - self._last_clean <= every:
            return
        operations.housekeeping(using=self.using)
        self._last_clean = time.monotonic()

    def check_objectives(self) -> None:
        """Compare the queues with their objectives and signal the crossings this worker
        wins (nothing to do, and no query, when no queue has one)."""
        slo.check(using=self.using)

    def _register_again(self, beat: dict[str, Any], *, held: int, renewed: int) -> None:
        """The heartbeat found no row of this worker: housekeeping deleted it after a long
        silence (the process was stopped, SIGSTOP or swapped out, for
        ``DEAD_WORKER_AFTER_LEASES`` leases) or an operator did. The worker is alive, so it
        registers again: the admin, the API and ``requeue`` see it, and do not take its
        running jobs from under it. Of the ``held`` leases, the heartbeat just ``renewed``
        those still its own; a row that another worker claimed meanwhile (or an operator
        requeued) is not, and this worker's writes of it are owner-checked and log LOST."""
        worker = self.worker
        if worker.halted.is_set():
            return  # shutting down: the row was deleted by the worker's shutdown
        WorkerRow.objects.using(self.using).update_or_create(
            id=worker.id, defaults={**worker.identity(), **beat, "last_seen_at": Now()})
        logger.warning("Worker %s found its row gone (housekeeping deletes the row of a "
                       "worker silent for %g s, an operator may delete it by hand) and "
                       "registered again. It still holds %s of the %s job(s) it works on%s.",
                       worker.id, operations.DEAD_WORKER_AFTER_LEASES
                       * float(jobguard_settings.RETRY_AFTER), renewed, held,
                       "" if renewed == held else
                       "; the others went back to the queue meanwhile and end as LOST here")
