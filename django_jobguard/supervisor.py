"""``jobworker --concurrency N``: N worker processes under one supervisor.

Each child is a fresh interpreter (``spawn``) running one :class:`Worker`. A child that exits
non-zero (crash, hard timeout, memory limit) is replaced; SIGTERM/SIGINT are passed on and the
supervisor exits once every child has finished its current job.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import signal
import time
from typing import Any

from django_jobguard._spawn import child_main
from django_jobguard.worker import WorkerOptions

logger = logging.getLogger("django_jobguard.supervisor")


class Supervisor:
    """Keeps ``processes`` workers running until stopped or until they all exit cleanly."""

    def __init__(self, options: WorkerOptions, *, processes: int, verbosity: int = 1,
                 stdout: Any = None) -> None:
        self.options = options
        self.processes = processes
        self.verbosity = verbosity
        self.stdout = stdout
        self._ctx = multiprocessing.get_context("spawn")
        self._stopping = False
        self._started: dict[int, float] = {}
        self._restart_delay = 0.5

    def _spawn(self) -> Any:
        proc = self._ctx.Process(target=child_main,
                                 args=(dataclasses.asdict(self.options), self.verbosity),
                                 daemon=False)
        proc.start()
        self._started[proc.pid] = time.monotonic()
        return proc

    def run(self) -> int:
        def on_stop(signum: int, frame: Any) -> None:
            self._stopping = True
            for proc in children:
                if proc.is_alive():
                    proc.terminate()  # SIGTERM: the child finishes its job, then exits

        children = [self._spawn() for _ in range(self.processes)]
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        while children:
            time.sleep(0.2)
            for proc in list(children):
                if proc.is_alive():
                    continue
                children.remove(proc)
                proc.join()
                if proc.exitcode != 0 and not self._stopping:
                    logger.warning("Worker pid %s exited with %s; starting a new one.",
                                   proc.pid, proc.exitcode)
                    if self.stdout is not None and self.verbosity:
                        self.stdout.write(f"worker pid {proc.pid} exited with {proc.exitcode}; "
                                          f"restarting")
                    # A child that dies right after starting (bad settings, database down)
                    # is restarted with a growing delay instead of in a hot loop.
                    lived = time.monotonic() - self._started.pop(proc.pid, 0)
                    self._restart_delay = 0.5 if lived > 10 else min(self._restart_delay * 2, 30)
                    time.sleep(self._restart_delay)
                    if not self._stopping:
                        children.append(self._spawn())
        return 0
