"""``jobworker --concurrency N``: N worker processes under one supervisor.

Each child is a fresh interpreter (``spawn``) running one :class:`Worker`. A child that exits
for any reason the supervisor did not ask for (crash, hard timeout, memory limit, a job calling
``os._exit(0)``) is logged and replaced: only a child whose worker returned by itself with
code 0 (a stop condition such as ``--stop-when-empty``) is not. SIGTERM/SIGINT are passed on
and the supervisor exits once every child has finished its current job.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import signal
import time
from typing import Any

from django_jobguard.worker import child_process as child
from django_jobguard.worker.loop import WorkerOptions

logger = logging.getLogger("django_jobguard.supervisor")


class Supervisor:
    """Keeps ``processes`` workers running until stopped or until they all exit cleanly."""

    def __init__(self, options: WorkerOptions, *, processes: int, verbosity: int = 1,
                 stdout: Any = None, log_format: str | None = None,
                 metrics: Any = None) -> None:
        self.options = options
        self.processes = processes
        self.verbosity = verbosity
        self.stdout = stdout
        self.log_format = log_format
        #: The ``--metrics-port`` server (multiprocess mode), started before the children.
        self.metrics = metrics
        self._ctx = multiprocessing.get_context("spawn")
        self._stopping = False
        self._started: dict[int, float] = {}
        self._finished: dict[int, Any] = {}  # pid → flag the child sets when its worker returns
        self._restart_delay = 0.5

    def _spawn(self) -> Any:
        finished = self._ctx.Value("b", 0, lock=False)
        proc = self._ctx.Process(target=child.main,
                                 args=(dataclasses.asdict(self.options), self.verbosity,
                                       finished, self.log_format, self.metrics is not None),
                                 daemon=False)
        proc.start()
        pid = proc.pid
        assert pid is not None  # set by start()
        self._started[pid] = time.monotonic()
        self._finished[pid] = finished
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
                finished = self._finished.pop(proc.pid)
                if self.metrics is not None:
                    self.metrics.child_exited(proc.pid)
                on_its_own = proc.exitcode == 0 and finished.value == 1
                if not on_its_own and not self._stopping:
                    why = ("without its worker stopping (the job's code ended the process?)"
                           if proc.exitcode == 0 else f"with {proc.exitcode}")
                    logger.warning("Worker pid %s exited %s; starting a new one.",
                                   proc.pid, why)
                    if self.stdout is not None and self.verbosity and self.log_format != "json":
                        self.stdout.write(f"worker pid {proc.pid} exited {why}; restarting")
                    # A child that dies right after starting (bad settings, database down)
                    # is restarted with a growing delay instead of in a hot loop.
                    lived = time.monotonic() - self._started.pop(proc.pid, 0)
                    self._restart_delay = 0.5 if lived > 10 else min(self._restart_delay * 2, 30)
                    time.sleep(self._restart_delay)
                    if not self._stopping:
                        children.append(self._spawn())
        return 0
