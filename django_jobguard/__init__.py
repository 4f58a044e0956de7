"""django-jobguard: an ORM-backed job queue with unique jobs, overlap locks, rate limits and
exception throttling. The public API is importable from here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# What type checkers and IDEs see behind the lazy imports below (ruff: F401 is off here).
if TYPE_CHECKING:
    from django_jobguard.context import JobContext
    from django_jobguard.cron import CronExpression
    from django_jobguard.decorators import job, unique, unique_until_processing, without_overlapping
    from django_jobguard.exceptions import (
        JobTimeoutError,
        ManuallyFailedError,
        MaxAttemptsExceededError,
        StoreUnavailableError,
    )
    from django_jobguard.iterable import IterableJob
    from django_jobguard.jobs import Dispatched, Job, dispatch, dispatch_many, dispatch_sync
    from django_jobguard.limits import Limit, UnknownLimiterError, rate_limiter
    from django_jobguard.middleware import JobMiddleware
    from django_jobguard.middleware.rate_limited import RateLimited
    from django_jobguard.middleware.skip import Skip
    from django_jobguard.middleware.throttles_exceptions import ThrottlesExceptions
    from django_jobguard.middleware.without_overlapping import WithoutOverlapping
    from django_jobguard.outcome import JobState, Outcome
    from django_jobguard.retry import RetryPolicy
    from django_jobguard.schedules import Schedule, periodic
    from django_jobguard.stores import get_store
    from django_jobguard.unique_jobs import ShouldBeUnique, ShouldBeUniqueUntilProcessing
    from django_jobguard.workflows.batches import Batchable, batch
    from django_jobguard.workflows.chains import chain

__version__ = "0.1.0"

_EXPORTS = {
    "Job": "django_jobguard.jobs",
    "job": "django_jobguard.decorators",
    "dispatch": "django_jobguard.jobs",
    "dispatch_many": "django_jobguard.jobs",
    "dispatch_sync": "django_jobguard.jobs",
    "Dispatched": "django_jobguard.jobs",
    "IterableJob": "django_jobguard.iterable",
    "JobContext": "django_jobguard.context",
    "RetryPolicy": "django_jobguard.retry",
    "Outcome": "django_jobguard.outcome",
    "JobState": "django_jobguard.outcome",
    "JobMiddleware": "django_jobguard.middleware",
    "ShouldBeUnique": "django_jobguard.unique_jobs",
    "ShouldBeUniqueUntilProcessing": "django_jobguard.unique_jobs",
    "unique": "django_jobguard.decorators",
    "unique_until_processing": "django_jobguard.decorators",
    "WithoutOverlapping": "django_jobguard.middleware.without_overlapping",
    "without_overlapping": "django_jobguard.decorators",
    "MaxAttemptsExceededError": "django_jobguard.exceptions",
    "JobTimeoutError": "django_jobguard.exceptions",
    "ManuallyFailedError": "django_jobguard.exceptions",
    "StoreUnavailableError": "django_jobguard.exceptions",
    "get_store": "django_jobguard.stores",
    # limits
    "Limit": "django_jobguard.limits",
    "rate_limiter": "django_jobguard.limits",
    "UnknownLimiterError": "django_jobguard.limits",
    "RateLimited": "django_jobguard.middleware.rate_limited",
    "ThrottlesExceptions": "django_jobguard.middleware.throttles_exceptions",
    "Skip": "django_jobguard.middleware.skip",
    # workflows
    "chain": "django_jobguard.workflows.chains",
    "batch": "django_jobguard.workflows.batches",
    "Batchable": "django_jobguard.workflows.batches",
    # periodic jobs
    "periodic": "django_jobguard.schedules",
    "Schedule": "django_jobguard.schedules",
    "CronExpression": "django_jobguard.cron",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import lazily so that ``import django_jobguard`` works before Django is set up."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_jobguard' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
