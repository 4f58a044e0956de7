"""The hard time limit: a small process beside the worker that kills it when a job runs past
its timeout and the grace period.

The worker enforces a job's ``timeout`` itself (SIGALRM, :mod:`django_jobguard.timeouts`),
but a Python signal handler only runs between bytecodes of the main thread: a job inside C
code that holds the GIL (``sum(range(10**10))``, a catastrophic regex, some C extensions)
cannot be interrupted, and the worker's heartbeat thread cannot renew the job's lease either.
Only another process can stop it. The watchdog is that process: started on the first job
with a timeout, told over a pipe when each such job starts and ends, and it sends SIGKILL to
the worker once a job has run ``timeout + GRACE + MARGIN`` seconds. The job's lease then
brings it back and its retry policy decides (a ``tries=1`` job is failed with "1 of 1 tries
used"); ``jobworker --concurrency`` starts a new child, a single worker is restarted by its
process manager.

This file uses the standard library only and runs as a script (``python -I -S
watchdog.py PID``): no Django, so the watchdog costs a few MB and starts in milliseconds.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import signal
import subprocess
import sys
import time

logger = logging.getLogger("django_jobguard.worker")

#: Seconds after the in-process grace (timeouts.GRACE) before the watchdog kills.
MARGIN = 1.0


class Watchdog:
    """The worker's side: ``arm()`` as a job with a time limit starts, ``disarm()`` as it
    ends. The watchdog process starts on the first ``arm()`` and ends with the worker."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()  # the process to kill
        self._owner = os.getpid()  # the process that talks to it (a forked child does not)
        self._proc: subprocess.Popen | None = None

    def arm(self, seconds: float, label: str) -> None:
        """Kill this worker if the job ``label`` is still running ``seconds`` from now."""
        self._send(f"arm {seconds:.3f} {' '.join(label.split())}\n", start=True)

    def disarm(self) -> None:
        """The job ended in time."""
        self._send("disarm\n", start=False)

    def close(self) -> None:
        """Stop the watchdog (closing the pipe ends it)."""
        proc, self._proc = self._proc, None
        if proc is not None and self._owner == os.getpid():
            proc.stdin.close()
            proc.wait(timeout=5)

    def _send(self, line: str, *, start: bool) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None  # it died (killed by hand?): a new one takes over
        if self._proc is None:
            if not start:
                return
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(self.pid)],
                stdin=subprocess.PIPE, close_fds=True,
                # Its own session: a Ctrl-C or SIGTERM to the worker's process group is for
                # the worker, which finishes its job and then closes the pipe.
                start_new_session=True)
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except OSError:  # it died between poll() and the write; the next arm() restarts it
            logger.warning("The hard time limit's watchdog process is gone; starting a new "
                           "one at the next job.")
            self._proc = None


_watchdog: Watchdog | None = None


def for_this_process() -> Watchdog:
    """This process's watchdog (one per worker process; a forked child gets its own)."""
    global _watchdog
    if _watchdog is None or _watchdog._owner != os.getpid():
        _watchdog = Watchdog()
        atexit.register(_watchdog.close)  # the pipe would close anyway; this waits for it
    return _watchdog


def main(argv: list[str]) -> None:
    """The watchdog process: read ``arm SECONDS LABEL`` / ``disarm`` lines; kill the worker
    ``argv[1]`` when an armed deadline passes; exit when the worker closes the pipe."""
    pid = int(argv[1])
    deadline: float | None = None
    limit, label, pending = 0.0, "", b""
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([0], [], [], wait)
        if not readable:
            sys.stderr.write(f"jobguard watchdog: {label} is still running {limit:g} s after "
                             f"it started (its timeout, the grace period and a margin) in C "
                             f"code that no signal interrupts; killing worker pid {pid} "
                             f"(hard time limit).\n")
            sys.stderr.flush()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        chunk = os.read(0, 4096)
        if not chunk:
            return  # the worker exited
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            command, _, rest = line.decode().partition(" ")
            if command == "arm":
                seconds, _, label = rest.partition(" ")
                limit = float(seconds)
                deadline = time.monotonic() + limit
            elif command == "disarm":
                deadline = None


if __name__ == "__main__":
    main(sys.argv)
