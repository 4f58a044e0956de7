"""Durations and delays: "seconds >= 0 or a timedelta", validated in one place.

Every option that takes a length of time (``unique_for``, ``expire_after``, ``release_after``,
lock ttls, ``backoff``) goes through :func:`seconds`. A delay (``dispatch(delay=...)``,
``job.release(delay)``) becomes a :class:`Due`: either seconds after the *database's* now or an
absolute time, never a time computed with this process's clock, so app servers with skewed
clocks agree on when a job is due.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any, Literal, overload

from django.utils import timezone

#: What ``delay=`` accepts: seconds, a timedelta, an aware datetime, or ``None`` (now).
Delay = int | float | datetime.timedelta | datetime.datetime | None


@overload
def seconds(value: Any, *, name: str, allow_none: Literal[False] = False) -> float: ...


@overload
def seconds(value: Any, *, name: str, allow_none: bool) -> float | None: ...


def seconds(value: Any, *, name: str, allow_none: bool = False) -> float | None:
    """``value`` (seconds >= 0 or a timedelta) as float seconds, or ``ValueError`` naming
    ``name``. ``None`` passes through when ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be seconds >= 0 (or a timedelta), not {value!r}.")
    return float(value)


def seconds_list(value: Any, *, name: str) -> tuple[float, ...]:
    """Seconds, or a list of seconds (``backoff``), as a tuple of floats."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return tuple(seconds(item, name=name) for item in items)


@dataclass(frozen=True)
class Due:
    """When a row becomes claimable: ``delay`` seconds after the database's now, or ``at``."""

    delay: float | None = None
    at: datetime.datetime | None = None

    @property
    def immediate(self) -> bool:
        return self.at is None and not self.delay


NOW = Due()


def due(delay: Delay, *, name: str = "delay") -> Due:
    """The :class:`Due` of a ``delay`` argument; ``TypeError``/``ValueError`` naming ``name``."""
    if delay is None:
        return NOW
    if isinstance(delay, datetime.datetime):
        if timezone.is_naive(delay):
            raise ValueError(f"{name} must be an aware datetime (or seconds / a timedelta).")
        return Due(at=delay)
    if not isinstance(delay, (int, float, datetime.timedelta)) or isinstance(delay, bool):
        raise TypeError(f"{name} must be seconds, a timedelta or a datetime, not {delay!r}.")
    value = seconds(delay, name=name)
    return Due(delay=value) if value else NOW
