"""Run a job's middleware, outermost first, around ``handle()``: shared by the worker's
pipeline and ``dispatch_sync()``, so neither needs the other."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_jobguard import carriers, unique_jobs

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
        if inspect.iscoroutine(result):
            result.close()
            raise TypeError(f"{job.name}.handle() returned a coroutine without awaiting it; "
                            f"declare handle() 'async def' to make it an async job.")
        context.handle_returned = True
        return result

    chain: Callable[[JobLike], Any] = call_handle
    for middleware in reversed(list(job.middleware())):
        chain = functools.partial(middleware.handle, next=chain)
    with carriers.restored(job.context.envelope.context):  # the dispatcher's context
        return chain(job)


async def run_middleware_async(job: JobLike) -> Any:
    """:func:`run_middleware` for an async job, on the event loop: ``await job.handle()``.

    A middleware with an ``ahandle(job, next)`` coroutine (every built-in one) runs on the
    loop and awaits ``next``; one with only a sync ``handle(job, next)`` runs off the loop
    (it may use the ORM), its ``next()`` running the rest of the chain back on the loop."""
    from django_jobguard import aio

    async def call_handle(job: JobLike) -> Any:
        context = job.context
        context.handle_started = True
        if unique_jobs.releases_on_start(job):
            await aio.call_sync(unique_jobs.release_on_start, job)
        try:
            result = await job.handle()
        finally:
            context.handle_finished = True
        context.handle_returned = True
        return result

    chain: Callable[[JobLike], Any] = call_handle
    for middleware in reversed(list(job.middleware())):
        chain = functools.partial(_step, middleware, next=chain)
    with carriers.restored(job.context.envelope.context):  # in this job's own task
        return await chain(job)


async def _step(middleware: Any, job: JobLike, next: Callable[[JobLike], Any]) -> Any:
    from asgiref.sync import async_to_sync, sync_to_async

    from django_jobguard import aio

    ahandle = getattr(middleware, "ahandle", None)
    if ahandle is not None:
        return await ahandle(job, next)

    def next_sync(job: JobLike) -> Any:
        return async_to_sync(next)(job)

    # In a worker, a thread of its own: the shared sync thread would wait for the whole job
    # (and there nothing would close the connection a database restart broke).
    if aio.on_worker_loop():
        return await sync_to_async(aio.closing_broken(middleware.handle),
                                   thread_sensitive=False)(job, next_sync)
    return await sync_to_async(middleware.handle, thread_sensitive=True)(job, next_sync)
