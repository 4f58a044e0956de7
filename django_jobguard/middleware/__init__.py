"""Job middleware: objects returned from ``Job.middleware()`` that wrap ``handle()``.

A middleware's ``handle(job, next)`` either calls ``next(job)`` to run the rest of the chain,
calls ``job.defer(delay)`` / ``job.release(delay)`` to put the job back, or returns without
calling ``next`` to drop the job (it is deleted, not failed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_jobguard.context import JobLike

Next = Callable[["JobLike"], Any]


class JobMiddleware:
    """Base class for middleware; the default passes straight through."""

    def handle(self, job: JobLike, next: Next) -> Any:
        return next(job)
