"""What jobguard takes as "now": the database's and Redis's own clocks, shifted by the test
clock's offset (always 0 in production; only :func:`django_jobguard.testing.clock` sets it).

Every place that asks for "now" goes through here: :func:`db_now` in ORM queries, the dialects'
clock SQL (built with :func:`offset` when a dialect is made), the Redis store's scripts
(:func:`store_now_us`) and Python's :func:`now` in the pipeline and middleware.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db.models import Value
from django.db.models.functions import Now
from django.utils import timezone

__all__ = ["db_now", "now", "offset", "set_offset", "store_now_us"]

_offset = 0.0


def offset() -> float:
    """Seconds the test clock is ahead of the real clocks (0 outside a test clock)."""
    return _offset


def set_offset(seconds: float) -> None:
    """Move every "now" ``seconds`` ahead of the real clocks (the test clock's lever; the
    dialects and stores made before must then be made again to read it)."""
    global _offset
    _offset = float(seconds)


def now() -> datetime.datetime:
    """Python's now (aware), plus the test clock's offset."""
    value = timezone.now()
    return value + datetime.timedelta(seconds=_offset) if _offset else value


def db_now() -> Any:
    """The database's now for an ORM query: ``Now()``, plus the offset under a test clock."""
    return Now() + Value(datetime.timedelta(seconds=_offset)) if _offset else Now()


def store_now_us() -> int | None:
    """What a Redis script takes as now, in microseconds: ``None`` (the server's ``TIME``),
    or under a test clock this process's shifted clock."""
    if not _offset:
        return None
    return round(now().timestamp() * 1_000_000)
