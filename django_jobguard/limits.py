"""Rate limits: the ``Limit`` value and the registry of named limiters.

A limiter is a function of the job that says how often jobs like it may start::

    @rate_limiter("exports")
    def exports(job):
        if job.user.is_premium:
            return Limit.none()
        return Limit.per_hour(5).by(job.user.pk)

and ``RateLimited("exports")`` in a job's ``middleware()`` applies it. The counting is done
by the store (see :mod:`django_jobguard.stores.counters` for the sliding-window algorithm).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from django_jobguard import keys
from django_jobguard.exceptions import JobGuardError

if TYPE_CHECKING:
    from django_jobguard.context import JobLike

__all__ = ["Limit", "RateLimiterRegistry", "UnknownLimiterError", "rate_limiter"]

_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


class UnknownLimiterError(JobGuardError, LookupError):
    """``RateLimited`` names a limiter that was never defined."""


@dataclass(frozen=True)
class Limit:
    """At most ``max_attempts`` job starts in any ``decay_seconds``, counted per ``key``."""

    max_attempts: int
    decay_seconds: float
    key: str = ""
    unlimited: bool = False

    def __post_init__(self) -> None:
        if self.unlimited:
            return
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or self.max_attempts < 1:
            raise ValueError(f"A Limit allows a whole number of starts of at least 1, not "
                             f"{self.max_attempts!r} (use Limit.none() for no limit).")
        if isinstance(self.decay_seconds, bool) or not isinstance(self.decay_seconds,
                                                                  (int, float)) \
                or not self.decay_seconds > 0:
            raise ValueError(f"A Limit's window must be a positive number of seconds, not "
                             f"{self.decay_seconds!r}.")

    @classmethod
    def per_second(cls, max_attempts: int, decay_seconds: float = 1) -> Limit:
        """``max_attempts`` starts per ``decay_seconds`` seconds."""
        return cls(max_attempts, decay_seconds)

    @classmethod
    def per_minute(cls, max_attempts: int, decay_minutes: float = 1) -> Limit:
        return cls(max_attempts, decay_minutes * 60)

    @classmethod
    def per_minutes(cls, decay_minutes: float, max_attempts: int) -> Limit:
        """Laravel's argument order: ``per_minutes(10, 100)`` is 100 per 10 minutes."""
        return cls(max_attempts, decay_minutes * 60)

    @classmethod
    def per_hour(cls, max_attempts: int, decay_hours: float = 1) -> Limit:
        return cls(max_attempts, decay_hours * 3600)

    @classmethod
    def per_day(cls, max_attempts: int, decay_days: float = 1) -> Limit:
        return cls(max_attempts, decay_days * 86400)

    @classmethod
    def none(cls) -> Limit:
        """No limit: the job runs without touching a counter."""
        return cls(0, 0, unlimited=True)

    @classmethod
    def parse(cls, rate: str) -> Limit:
        """A DRF-style rate: ``"5/hour"``, ``"100/m"``, ``"10/sec"``, ``"1000/day"``, and with a
        multiplier ``"20/5min"`` (20 per 5 minutes)."""
        match = _RATE.match(rate) if isinstance(rate, str) else None
        unit = _UNITS.get(match.group(3).lower()) if match else None
        if match is None or unit is None:
            raise ValueError(
                f"Invalid rate {rate!r}: expected '<number>/<period>' like '5/hour', '100/min' "
                f"or '20/5m'; periods are s/sec/second, m/min/minute, h/hour, d/day.")
        multiplier = float(match.group(2)) if match.group(2) else 1
        seconds = multiplier * unit
        return cls(int(match.group(1)), int(seconds) if seconds == int(seconds) else seconds)

    def by(self, key: Any) -> Limit:
        """The same limit counted separately per ``key`` (a user id, a tenant, …)."""
        return replace(self, key=str(key))

    def __str__(self) -> str:
        if self.unlimited:
            return "unlimited"
        per = f"{self.decay_seconds:g}s"
        return f"{self.max_attempts}/{per}" + (f" by {self.key}" if self.key else "")


Limiter = Callable[["JobLike"], "Limit | str | Iterable[Limit | str]"]
#: What :meth:`RateLimiterRegistry.define` takes, and gives back unchanged.
Defined = TypeVar("Defined", bound="Limiter | Limit | str")


class RateLimiterRegistry:
    """Named limiters: ``rate_limiter.define(name, fn)`` or ``@rate_limiter(name)``."""

    def __init__(self) -> None:
        self._limiters: dict[str, Limiter] = {}

    def define(self, name: str, limiter: Defined) -> Defined:
        """Register ``limiter`` (a function of the job, or a fixed Limit / rate string) under
        ``name``; defining a name again replaces it."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A limiter needs a non-empty name, not {name!r}.")
        if isinstance(limiter, (Limit, str)):
            fixed = Limit.parse(limiter) if isinstance(limiter, str) else limiter
            self._limiters[name] = lambda job: fixed
        elif callable(limiter):
            self._limiters[name] = limiter
        else:
            raise TypeError(f"Limiter {name!r} must be a function of the job, a Limit or a rate "
                            f"string like '5/hour', not {limiter!r}.")
        return limiter

    def __call__(self, name: str) -> Callable[[Limiter], Limiter]:
        """Decorator form: ``@rate_limiter("exports")``."""

        def decorate(func: Limiter) -> Limiter:
            self.define(name, func)
            return func

        return decorate

    def __contains__(self, name: object) -> bool:
        return name in self._limiters

    def names(self) -> list[str]:
        return sorted(self._limiters)

    def remove(self, name: str) -> None:
        self._limiters.pop(name, None)

    def get(self, name: str) -> Limiter:
        try:
            return self._limiters[name]
        except KeyError:
            known = ", ".join(repr(n) for n in self.names()) or "none"
            raise UnknownLimiterError(
                f"No rate limiter is defined as {name!r} (defined: {known}). Define it with "
                f"rate_limiter.define({name!r}, fn) or @rate_limiter({name!r}) in a module "
                f"that is imported at start-up, such as <app>/jobs.py."
            ) from None

    def limits_for(self, name: str, job: JobLike) -> list[Limit]:
        """The limits limiter ``name`` gives ``job``, unlimited ones left out."""
        value: Any = self.get(name)(job)  # checked below: a user's function may return anything
        items = [value] if isinstance(value, (Limit, str)) else value
        try:
            items = list(items)
        except TypeError:
            items = [items]
        limits = []
        for item in items:
            if isinstance(item, str):
                item = Limit.parse(item)
            if not isinstance(item, Limit):
                raise TypeError(f"Limiter {name!r} returned {item!r}; it must return a Limit, "
                                f"a list of Limits or Limit.none().")
            if not item.unlimited:
                limits.append(item)
        return limits


rate_limiter = RateLimiterRegistry()


def window_key(name: str, limit: Limit) -> str:
    """The store key of ``limit`` under limiter ``name`` (see :func:`keys.rate`)."""
    return keys.rate(name, limit.decay_seconds, limit.key)
