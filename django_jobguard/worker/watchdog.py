"""The hard time limit: a small process beside the worker that kills it when a job runs past
its timeout and the grace period.

The worker enforces a job's ``timeout`` itself (SIGALRM, :mod:`django_jobguard.worker.timeouts`),
but a Python signal handler only runs between bytecodes of the main thread: a job inside C
code that holds the GIL (``sum(range(10**10))``, a catastrophic regex, some C extensions)
cannot be interrupted, and the worker's heartbeat thread cannot renew the job's lease either.
Only another process can stop it. The watchdog is that process: started on the first job
with a timeout, it reads the armed job's deadline from a small shared memory page the worker
writes as each such job starts and ends (no system call per job: writing to a pipe instead,
and waking the watchdog twice per job, cost a no-op job a tenth of its time), looks at it
every :data:`POLL` seconds, and sends SIGKILL to the worker once a job has run
``timeout + GRACE + MARGIN`` seconds. The pipe to its standard input only tells it that the
worker is gone (end of file). The job's lease then
brings it back and its retry policy decides (a ``tries=1`` job is failed with "1 of 1 tries
used"); ``jobworker --concurrency`` starts a new child, a single worker is restarted by its
process manager.

This file uses the standard library only and runs as a script (``python -I -S
watchdog.py PID``): no Django, so the watchdog costs a few MB and starts in milliseconds.
"""

from __future__ import annotations

import atexit
import logging
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time

logger = logging.getLogger("django_jobguard.worker")

#: Seconds after the in-process grace (timeouts.GRACE) before the watchdog kills.
MARGIN = 1.0
#: Seconds between two looks of the watchdog at the page (it may kill this much late).
POLL = 0.2
#: How often the worker checks, at an arm, that its watchdog is still alive.
ALIVE_EVERY = 1.0

#: A job whose hard limit comes at most this many seconds after the deadline the page is armed
#: for keeps that deadline (the watchdog may kill that much before the job's own hard limit,
#: still after its grace period): one write of its label per job, not a new deadline.
SLACK = MARGIN / 2

# The page: a sequence number (odd while the worker writes), the deadline (time.monotonic(),
# one clock for every process of the machine; 0.0: disarmed), the seconds armed, the label's
# length and bytes; then one byte, 1 while the job armed for runs (0: it ended, the deadline
# kept for the next job of the main thread, see Watchdog.start).
_HEAD = struct.Struct("<Qddh")
_SEQUENCE = struct.Struct("<Q")
_BODY = struct.Struct("<ddh")
_SECONDS_LENGTH = struct.Struct("<dh")  # the seconds and the label's length
_LABEL_MAX = 512
_RUNNING = _HEAD.size + _LABEL_MAX
_SIZE = mmap.PAGESIZE


class Watchdog:
    """The worker's side: :meth:`start` as a job with a time limit starts, :meth:`ended` as
    it ends. The watchdog process starts on the first :meth:`start` and ends with the
    worker."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()  # the process to kill
        self._owner = os.getpid()  # the process that talks to it (a forked child does not)
        self._proc: subprocess.Popen | None = None
        self._page: mmap.mmap | None = None
        self._sequence = 0
        self._checked = 0.0
        self._deadline = 0.0  # what the page holds

    def start(self, deadline: float, seconds: float, label: str, *,
              slack: float = SLACK) -> None:
        """Kill this worker if the job ``label`` is still running at ``deadline``
        (``time.monotonic()``; ``seconds``: the job's hard limit, for the message). A
        deadline armed before that is at most ``slack`` earlier is kept: only the label, the
        seconds and the running flag are written (a solo worker runs thousands of jobs a
        second; rewriting the armed record for each was a tenth of a no-op job)."""
        self._ensure_running()
        page = self._page
        assert page is not None  # mapped by _ensure_running
        if not deadline - slack <= self._deadline <= deadline:
            self._write(deadline, seconds, _one_line(label))
            return
        # Outside the sequence: the watchdog reads the label only to name a job it kills,
        # when this thread is stuck in it, not writing.
        data = _one_line(label).encode()[:_LABEL_MAX]
        page[_HEAD.size:_HEAD.size + len(data)] = data
        _SECONDS_LENGTH.pack_into(page, _HEAD.size - _SECONDS_LENGTH.size, seconds, len(data))
        page[_RUNNING] = 1

    def ended(self) -> None:
        """The job ended in time: not running, its deadline kept on the page for the next
        :meth:`start`."""
        if self._page is not None:
            self._page[_RUNNING] = 0

    def close(self) -> None:
        """Stop the watchdog (closing the pipe ends it)."""
        proc, self._proc = self._proc, None
        if proc is not None and self._owner == os.getpid():
            assert proc.stdin is not None  # started with stdin=PIPE
            proc.stdin.close()
            proc.wait(timeout=5)

    def _write(self, deadline: float, seconds: float, label: str) -> None:
        data = label.encode()[:_LABEL_MAX]
        page = self._page
        assert page is not None  # armed: _ensure_running mapped it; disarmed: checked
        sequence = self._sequence + 1  # odd: a reader that sees it, or a change, reads again
        _SEQUENCE.pack_into(page, 0, sequence)
        if data:
            page[_HEAD.size:_HEAD.size + len(data)] = data
        _BODY.pack_into(page, _SEQUENCE.size, deadline, seconds, len(data))
        page[_RUNNING] = 1
        self._sequence = sequence + 1
        _SEQUENCE.pack_into(page, 0, sequence + 1)
        self._deadline = deadline

    def _ensure_running(self) -> None:
        now = time.monotonic()
        if self._proc is not None and now - self._checked >= ALIVE_EVERY:
            self._checked = now
            if self._proc.poll() is not None:  # it died (killed by hand?): a new one
                logger.warning("The hard time limit's watchdog process is gone; starting a "
                               "new one.")
                self._proc = None
        if self._proc is not None:
            return
        with tempfile.TemporaryFile() as file:
            file.truncate(_SIZE)
            self._page = mmap.mmap(file.fileno(), _SIZE)
            self._sequence = 0
            self._deadline = 0.0
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(self.pid),
                 str(file.fileno())],
                stdin=subprocess.PIPE, close_fds=True, pass_fds=(file.fileno(),),
                # Its own session: a Ctrl-C or SIGTERM to the worker's process group is for
                # the worker, which finishes its job and then closes the pipe.
                start_new_session=True)
        self._checked = now


_watchdog: Watchdog | None = None


def for_this_process() -> Watchdog:
    """This process's watchdog (one per worker process; a forked child gets its own)."""
    global _watchdog
    if _watchdog is None:
        _watchdog = Watchdog()
        atexit.register(_watchdog.close)  # the pipe would close anyway; this waits for it
    return _watchdog


def _forget_in_child() -> None:
    """A forked child talks to a watchdog of its own (the parent's watches the parent)."""
    global _watchdog
    _watchdog = None


os.register_at_fork(after_in_child=_forget_in_child)


def _one_line(label: str) -> str:
    return label if label.isprintable() else " ".join(label.split())


def _read(page: mmap.mmap) -> tuple[float, float, str]:
    """The armed deadline (0 when none, or when its job is not running), seconds and label,
    as one write of the worker left them (all 0 and empty while the worker is writing: the
    next look reads them)."""
    for _ in range(10):
        before, deadline, seconds, length = _HEAD.unpack_from(page)
        label = page[_HEAD.size:_HEAD.size + max(0, min(length, _LABEL_MAX))]
        running = page[_RUNNING]
        if before % 2 == 0 and struct.unpack_from("<Q", page)[0] == before:
            return (deadline if running else 0.0), seconds, label.decode(errors="replace")
        time.sleep(0.001)
    return 0.0, 0.0, ""


def main(argv: list[str]) -> None:
    """The watchdog process: every :data:`POLL` seconds, kill the worker ``argv[1]`` if the
    deadline armed on the page (file descriptor ``argv[2]``) has passed; exit when the worker
    closes the pipe."""
    pid = int(argv[1])
    page = mmap.mmap(int(argv[2]), _SIZE)
    while True:
        readable, _, _ = select.select([0], [], [], POLL)
        if readable and not os.read(0, 4096):
            return  # the worker exited
        deadline, seconds, label = _read(page)
        if deadline and time.monotonic() >= deadline:
            sys.stderr.write(f"jobguard watchdog: {label} is still running {seconds:g} s after "
                             f"it started (its timeout, the grace period and a margin) in C "
                             f"code that no signal interrupts; killing worker pid {pid} "
                             f"(hard time limit).\n")
            sys.stderr.flush()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


if __name__ == "__main__":
    main(sys.argv)
