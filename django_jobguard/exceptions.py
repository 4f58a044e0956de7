"""Exceptions that end up in failed jobs as the reason a job stopped."""

from __future__ import annotations


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


class PayloadError(JobGuardError):
    """A queued row's payload cannot be turned back into a job."""
