"""``jobworker --reload``: restart the worker when its code changes, as ``runserver`` does.

The command's own process (the *parent*) runs the worker in a child process and starts a new
child whenever the old one asks for it. The child watches the files of every module it has
loaded, as Django's autoreloader does (its ``StatReloader``, polling each second). On a
change it stops claiming, gives back the rows it claimed ahead, lets the running job finish
and exits with :data:`RESTART`; the parent then starts a child on the new code. A job still
running ``grace`` seconds after the change is interrupted with
:class:`~django_jobguard.exceptions.WorkerRestartError` and goes back to the queue without
using an attempt, so the new child runs it again from the start: no job is lost and none is
counted twice. A child that exits with an error (a syntax error, a database that is down) is
started again once a file changes.

SIGTERM or SIGINT (Ctrl-C) to the parent stops the child as they stop a worker: after the
running job.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from django.utils import autoreload

from django_jobguard.exceptions import WorkerRestartError
from django_jobguard.worker.loop import StopFlag, Worker

logger = logging.getLogger("django_jobguard.worker")

#: The exit code with which a child asks to be started again (Django's autoreloader uses 3).
RESTART = 3
#: Sent to the child itself to interrupt a job still running after the grace period.
INTERRUPT = signal.SIGUSR1

Write = Callable[[str], None]


def run_with_reloader(make_worker: Callable[[], Worker], *, grace: float,
                      write: Write) -> int:
    """Run ``make_worker()`` in a child process restarted on code changes; returns the exit
    code of the last child (in the child: the code it exits with)."""
    if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true":
        return run_child(make_worker(), grace=grace, write=write)
    return run_parent(write=write)


# -- the parent: start children, restart them ------------------------------------------------

def run_parent(*, write: Write) -> int:
    """Start children until one exits by itself (0, or an error and Ctrl-C) or SIGTERM."""
    args = autoreload.get_child_arguments()
    env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    stopping = StopFlag()  # set by signal handlers
    child: subprocess.Popen[bytes] | None = None

    def on_stop(signum: int, frame: Any) -> None:
        # Passed on as SIGTERM: Ctrl-C from a terminal reached the child too, and a
        # second stop signal only repeats the first.
        stopping.set()
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    while True:
        files = WatchedFiles()  # before the child starts: a fix made meanwhile counts
        child = subprocess.Popen(args, env=env, close_fds=False)
        code = child.wait()
        if stopping.is_set() or code == 0:
            return code
        if code != RESTART:
            write(f"The worker exited with {code}; it starts again when a file changes "
                  f"(Ctrl-C to quit).")
            if not _wait_for_change(files, stopping):
                return code


def _wait_for_change(files: WatchedFiles, stopping: threading.Event) -> bool:
    """Block until one of ``files`` changes (``True``) or the parent is stopped
    (``False``)."""
    while files.changed() is None:
        if stopping.wait(files.POLL):
            return False
    return True


class WatchedFiles:
    """The files ``runserver`` watches (every loaded module, and what ``autoreload_started``
    receivers add: template and locale directories), compared each second with the
    modification times they had when this was made.

    The first snapshot is taken here, before the worker takes a job, so a change made while
    the first job runs is seen (Django's reloader takes it in its thread, a moment later)."""

    POLL = 1.0

    def __init__(self) -> None:
        self.reloader = autoreload.StatReloader()
        autoreload.autoreload_started.send(sender=self.reloader)
        self.mtimes = dict(self.reloader.snapshot_files())

    def changed(self) -> Any:
        """The first file modified since the snapshot (a module loaded since then counts
        from when it is first seen), or ``None``."""
        for path, mtime in self.reloader.snapshot_files():
            if mtime > self.mtimes.setdefault(path, mtime):
                return path
        return None


# -- the child: run the worker, watch the files ----------------------------------------------

def run_child(worker: Worker, *, grace: float, write: Write) -> int:
    """Run ``worker`` here until it stops; :data:`RESTART` if it stopped for a code change."""
    files = WatchedFiles()
    changed = threading.Event()
    finished = threading.Event()

    def watch() -> None:
        while not finished.wait(files.POLL):
            path = files.changed()
            if path is not None:
                changed.set()
                write(f"{path} changed; restarting the worker after the running job.")
                worker.stop()
                _interrupt_after(worker, grace, finished)
                return

    def on_interrupt(signum: int, frame: Any) -> None:
        worker.interrupt_job(WorkerRestartError(
            f"The job was still running {grace:g} s after a code change; the worker "
            f"restarts and the job goes back to the queue without using an attempt."))

    signal.signal(INTERRUPT, on_interrupt)
    threading.Thread(target=watch, name="jobguard-reloader", daemon=True).start()
    try:
        code = worker.run()
    finally:
        finished.set()
    return RESTART if changed.is_set() else code


def _interrupt_after(worker: Worker, grace: float, finished: threading.Event) -> None:
    """Once ``grace`` seconds pass, interrupt the running job (once per job: a job that
    catches the error is left to finish)."""
    interrupted: set[str | None] = set()
    while not finished.wait(grace):
        running = worker.pipeline.interruptible()
        if running is None or running.job_id in interrupted:
            continue
        interrupted.add(running.job_id)
        logger.warning("Job %s is still running %g s after a code change; interrupting it.",
                       running.job_id, grace)
        os.kill(os.getpid(), INTERRUPT)
