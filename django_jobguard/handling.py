"""Run a job's middleware, outermost first, around ``handle()``: shared by the worker's
pipeline and ``dispatch_sync()``, so neither needs the other."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_jobguard import unique_jobs

if TYPE_CHECKING:
    from django_jobguard.context import JobLike


def run_middleware(job: JobLike) -> Any:
    """The job's middleware, outermost first, around ``handle()``; records on the context
    whether ``handle()`` started, finished and returned."""

    def call_handle(job: JobLike) -> Any:
        context = job.context
        context.handle_started = True
        unique_jobs.release_on_start(job)  # after every middleware let the job through
        try:
            result = job.handle()
        finally:
            context.handle_finished = True  # the timeout no longer interrupts (timeouts.py)
        context.handle_returned = True
        return result

    chain: Callable[[JobLike], Any] = call_handle
    for middleware in reversed(list(job.middleware())):
        chain = functools.partial(middleware.handle, next=chain)
    return chain(job)
