"""Exceptions that end up in failed jobs as the reason a job stopped, and how any exception
a job raises is written down: one line for logs (:func:`describe`), the row's ``last_error``
(:func:`error_text`), a failed job's or a kept result's class path and traceback
(:func:`class_path`, :func:`traceback_text`), and a stored error shortened for a failure's
reason (:func:`short_error`)."""

from __future__ import annotations

import traceback


class JobGuardError(Exception):
    """Base class for jobguard's own errors."""


class MaxAttemptsExceededError(JobGuardError):
    """The job was taken again after using all of its ``tries`` (or its ``retry_until`` passed)."""


class MaxExceptionsExceededError(JobGuardError):
    """Not raised: the real exception is recorded; kept for ``isinstance`` checks in hooks."""


class JobTimeoutError(JobGuardError):
    """The job ran longer than its ``timeout``."""


class ManuallyFailedError(JobGuardError):
    """``job.fail()`` was called without an exception (or with a message)."""


class JobCancelledError(JobGuardError):
    """An operator cancelled the running job (kept as a kept result's error)."""


class JobFailedError(JobGuardError):
    """``handle.wait()``: the job failed for good; ``exception_class`` and ``traceback``
    say with what (as its result row keeps them)."""

    def __init__(self, message: str, *, exception_class: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.exception_class = exception_class
        self.traceback = traceback


class WorkerStoppedError(JobGuardError):
    """Raised in a running job when its worker stops at once (a second Ctrl-C): the job goes
    back to the queue without using an attempt and runs again from the start."""

    reason = "worker_stop"
    detail = "its worker was stopped at once (a second Ctrl-C)"


class StopTimeoutError(WorkerStoppedError):
    """Raised in a job still running ``--stop-timeout`` seconds after its worker began a
    graceful stop (SIGTERM, ``--max-time``): the job goes back to the queue without using an
    attempt and runs again from the start (or from its checkpoint)."""

    reason = "stop_timeout"
    detail = "its worker's --stop-timeout passed during a graceful stop"


class WorkerRestartError(WorkerStoppedError):
    """Raised in a job still running a grace period after ``jobworker --reload`` saw a code
    change: the job goes back to the queue without using an attempt and the restarted worker
    runs it again from the start."""

    reason = "worker_restart"
    detail = "its worker restarted for a code change"


class PayloadError(JobGuardError):
    """A queued row's payload cannot be turned back into a job."""


class PoisonRowError(JobGuardError):
    """A claimed row no worker can run: a column its database driver cannot load (a date
    outside 1-9999, PostgreSQL's ``infinity``), or a counter at its maximum. The worker
    quarantines it: the row becomes a failed job with this error as its reason."""


class StoreUnavailableError(JobGuardError):
    """A lock/counter store could not be reached: its server is down, restarting, still
    loading its data, or timed out. The store raises it, chained to the backend's error.

    Raised before ``handle()`` started (by ``WithoutOverlapping``, ``RateLimited``,
    ``ThrottlesExceptions`` or any middleware asking a store), the worker puts the job back a
    few seconds later without using an attempt: the job never ran. Raised by ``handle()`` or
    after it, it is the job's exception like any other (retried or failed by ``tries``).
    """

    def __init__(self, store: str, error: BaseException | str) -> None:
        super().__init__(store, error)
        self.store = store
        self.error = error

    def __str__(self) -> str:
        return f"store {self.store!r} is unavailable: {self.error}"

    @property
    def error_line(self) -> str:
        """The backend's error on one line, for a message (a driver's may span several)."""
        return " ".join(str(self.error).split())


# -- how a job's exception is written down ---------------------------------------------------

#: How much of a traceback a failed job and a kept result keep (the end of it).
TRACEBACK_LIMIT = 50_000


def class_path(exception: BaseException) -> str:
    """``module.Class`` of an exception."""
    return f"{type(exception).__module__}.{type(exception).__qualname__}"


def traceback_text(exception: BaseException, limit: int = TRACEBACK_LIMIT) -> str:
    """The formatted traceback of an exception (its last ``limit`` characters)."""
    return "".join(traceback.format_exception(type(exception), exception,
                                              exception.__traceback__))[-limit:]


def describe(exception: BaseException) -> str:
    """``module.Class: message`` of an exception (one line for logs and lists)."""
    return f"{class_path(exception)}: {exception}"[:2000]


def error_text(exception: BaseException) -> str:
    """What ``last_error`` keeps of a job's exception: :func:`describe`'s line, then the
    traceback (the end of it, when it is very long)."""
    return f"{describe(exception)}\n\n{traceback_text(exception, 20_000)}"


def short_error(text: str) -> str:
    """``Class: message`` from a stored error (``module.Class: message`` and a traceback)."""
    line = text.partition("\n")[0]
    path, sep, message = line.partition(": ")
    return f"{path.rsplit('.', 1)[-1]}{sep}{message}" if sep else line
