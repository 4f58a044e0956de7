"""``Skip``: drop a job (deleted as done, not failed) when / unless a condition holds."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_jobguard import aio
from django_jobguard.middleware import JobMiddleware, Next

if TYPE_CHECKING:
    from django_jobguard.context import JobLike

Condition = bool | Callable[..., Any]


class Skip(JobMiddleware):
    """``Skip.when(cond)`` / ``Skip.unless(cond)``; ``cond`` is a bool or a callable taking the
    job (or nothing), evaluated when the job starts."""

    def __init__(self, condition: Condition, *, skip_if: bool = True) -> None:
        if not isinstance(condition, bool) and not callable(condition):
            raise TypeError(f"Skip needs a bool or a callable, not {condition!r}.")
        self.condition = condition
        self.skip_if = skip_if

    @classmethod
    def when(cls, condition: Condition) -> Skip:
        """Drop the job if ``condition`` is true."""
        return cls(condition, skip_if=True)

    @classmethod
    def unless(cls, condition: Condition) -> Skip:
        """Drop the job if ``condition`` is false."""
        return cls(condition, skip_if=False)

    def __repr__(self) -> str:
        return f"Skip.{'when' if self.skip_if else 'unless'}({self.condition!r})"

    def evaluate(self, job: JobLike) -> bool:
        condition = self.condition
        if not callable(condition):
            return bool(condition)
        try:
            takes_job = bool(inspect.signature(condition).parameters)
        except (TypeError, ValueError):  # builtins without a signature
            takes_job = True
        return bool(condition(job) if takes_job else condition())

    def handle(self, job: JobLike, next: Next) -> Any:
        if self.evaluate(job) == self.skip_if:
            return None
        return next(job)

    async def ahandle(self, job: JobLike, next: Next) -> Any:
        """``handle()`` for an async job (the condition is evaluated off the loop)."""
        if await aio.call_sync(self.evaluate, job) == self.skip_if:
            return None
        return await next(job)
