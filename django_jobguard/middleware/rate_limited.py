"""``RateLimited``: start a job only while its named limiter has room.

Over the limit the job is deferred until the windows have a slot (plus jitter, so that the
jobs waiting on one window do not all wake at the same instant). A deferral does not use one
of the job's ``tries`` unless ``JOBGUARD['DEFERRALS_CONSUME_ATTEMPTS']``. The start is counted
before the job runs, so a run that fails still used its slot (as in Laravel).
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from django_jobguard import aio, durations
from django_jobguard.limits import Limit, rate_limiter, window_key
from django_jobguard.middleware import JobMiddleware, Next
from django_jobguard.stores import get_store
from django_jobguard.stores.base import RateWindow

if TYPE_CHECKING:
    from django_jobguard.context import JobLike

logger = logging.getLogger("django_jobguard.limits")

MAX_JITTER = 5.0


class RateLimited(JobMiddleware):
    """Apply limiter ``name`` (see :data:`~django_jobguard.limits.rate_limiter`).

    ``release_after``: defer by exactly this many seconds instead of until a slot frees.
    ``dont_release``: drop the job (deleted, not failed) instead of deferring it.
    ``jitter``: at most this many seconds added to a computed delay (default: one slot's
    share of the window, ``decay / max_attempts``, capped at 5 s).
    ``store``: the store alias holding the counters (default ``JOBGUARD['STORE']``).
    """

    def __init__(self, name: str, *, release_after: float | None = None,
                 dont_release: bool = False, jitter: float | None = None,
                 store: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"RateLimited needs a limiter name, not {name!r}.")
        self.name = name
        self.release_after = durations.seconds(release_after, allow_none=True,
                                               name="RateLimited(release_after=...)")
        self.dont_release = dont_release
        self.jitter = durations.seconds(jitter, allow_none=True, name="RateLimited(jitter=...)")
        self.store = store

    def __repr__(self) -> str:
        return f"RateLimited({self.name!r})"

    def handle(self, job: JobLike, next: Next) -> Any:
        return next(job) if self.admit(job) else None

    async def ahandle(self, job: JobLike, next: Next) -> Any:
        """``handle()`` for an async job (the counters are hit off the loop)."""
        return await next(job) if await aio.call_sync(self.admit, job) else None

    def admit(self, job: JobLike) -> bool:
        """Count the start against the limiter; False after deferring or dropping the job."""
        limits = rate_limiter.limits_for(self.name, job)  # UnknownLimiterError if undefined
        if not limits:
            return True
        windows = [RateWindow(key=window_key(self.name, limit), limit=limit.max_attempts,
                              decay=limit.decay_seconds) for limit in limits]
        decision = get_store(self.store).hit_rate_limits(windows)
        if decision.allowed:
            job.rate_limit_admitted_at = decision.now
            return True
        if self.dont_release:
            logger.info("%s [%s] dropped: limiter %r is full (%s).", job.name, job.job_id,
                        self.name, ", ".join(decision.blocked))
            return False
        job.defer(self.delay(decision.retry_after, limits), reason="rate_limited",
                  detail=f"rate limit {self.name!r} was full")
        return False

    def delay(self, retry_after: float, limits: list[Limit]) -> float:
        """Seconds to defer a job refused with ``retry_after``: ``release_after`` if given,
        else ``retry_after`` plus random jitter."""
        if self.release_after:
            return float(self.release_after)
        spread = self.jitter if self.jitter is not None else min(
            [MAX_JITTER] + [limit.decay_seconds / limit.max_attempts for limit in limits])
        return retry_after + random.uniform(0, spread)
