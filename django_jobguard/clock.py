"""What jobguard takes as "now": the database's and Redis's own clocks, shifted by the test
clock's offset (always 0 in production; only :func:`django_jobguard.testing.clock` sets it).

Every place that asks for "now" goes through here: :func:`db_now` in ORM queries, the dialects'
clock SQL (built with :func:`offset` when a dialect is made), the Redis store's scripts
(:func:`store_now_us`) and Python's :func:`now` in the pipeline and middleware.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db.models import Value
from django.db.models.functions import Now
from django.utils import timezone

__all__ = ["db_now", "lease_clock", "now", "offset", "set_offset", "store_now_us"]

_offset = 0.0

if hasattr(time, "CLOCK_BOOTTIME"):
    def lease_clock() -> float:
        """Seconds for timing a lease in this process: Linux's boot-time clock, which (unlike
        ``time.monotonic()``) goes on while the host is suspended, so a worker that wakes
        after its lease ran out does not take it as still held."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)
else:
    def lease_clock() -> float:
        """Seconds for timing a lease in this process (``time.monotonic()`` where there is
        no boot-time clock)."""
        return time.monotonic()


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
    if timezone.now is _django_now:  # (a test's patch of Django's now is honoured)
        zone = _zone
        if zone is _UNREAD:
            zone = _read_zone()
        value = datetime.datetime.now(zone)
    else:
        value = timezone.now()
    return value + datetime.timedelta(seconds=_offset) if _offset else value


# ``timezone.now()`` without its read of ``settings.USE_TZ`` (a call through Django's lazy
# settings object: a twentieth of a no-op job's run): the zone is read once, and again when
# a test changes the setting.
_django_now = timezone.now
_UNREAD: Any = object()
_zone: Any = _UNREAD


def _read_zone() -> datetime.tzinfo | None:
    global _zone
    _zone = datetime.UTC if settings.USE_TZ else None
    return _zone


def _forget_zone(*, setting: str, **kwargs: Any) -> None:
    global _zone
    if setting == "USE_TZ":
        _zone = _UNREAD


setting_changed.connect(_forget_zone)


def db_now() -> Any:
    """The database's now for an ORM query: ``Now()``, plus the offset under a test clock."""
    return Now() + Value(datetime.timedelta(seconds=_offset)) if _offset else Now()


def store_now_us() -> int | None:
    """What a Redis script takes as now, in microseconds: ``None`` (the server's ``TIME``),
    or under a test clock this process's shifted clock."""
    if not _offset:
        return None
    return round(now().timestamp() * 1_000_000)
