"""Five-field cron expressions (``*/5 * * * *``, ``@daily``) evaluated in a time zone.

:class:`CronExpression` parses ``minute hour day-of-month month day-of-week`` with lists,
ranges, steps and month/day names, and finds the instants (aware UTC datetimes) at which the
expression fires. Wall-clock times are matched in the schedule's time zone, with these rules
across daylight-saving changes:

* a time that does not exist (02:30 on a spring-forward night) runs once, at the first
  instant after the gap (03:00 local), unless the hour field is ``*``: an hourly-or-faster
  schedule has no ticks in a missing hour;
* a time that happens twice (02:30 on a fall-back night) runs once, at its first occurrence,
  unless the hour field is ``*``: then both occurrences run, so ``*/5`` keeps its pace.
"""

from __future__ import annotations

import datetime
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["ALIASES", "CronError", "CronExpression", "get_zone"]

UTC = datetime.UTC

#: ``@hourly``-style aliases (``@reboot`` has no meaning for a queue and is refused).
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTHS = {name: i for i, name in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)}
_DAYS = {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}

# (name, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)

#: How far ahead :meth:`CronExpression.next_after` looks (Feb 29 on a Monday is rare).
_HORIZON_DAYS = 366 * 28


class CronError(ValueError):
    """A cron expression that cannot be parsed, with the reason."""


def get_zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` (``CronError`` naming it when unknown)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise CronError(f"unknown time zone {name!r} (use an IANA name such as "
                        f"'Europe/Berlin' or 'UTC')") from None


def _number(text: str, field: str, low: int, high: int, names: dict[str, int]) -> int:
    value = names.get(text.lower())
    if value is None:
        if not text.isdigit():
            raise CronError(f"{field}: {text!r} is not a number"
                            + (f" or a name ({', '.join(names)})" if names else ""))
        value = int(text)
    if not low <= value <= high:
        raise CronError(f"{field}: {value} is outside {low}-{high}")
    return value


def _parse_field(text: str, field: str, low: int, high: int,
                 names: dict[str, int]) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field}: empty item in {text!r}")
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field}: step {step_text!r} must be a whole number above 0")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            start = _number(a, field, low, high, names)
            end = _number(b, field, low, high, names)
            if start > end:
                raise CronError(f"{field}: range {base!r} runs backwards")
        else:
            start = _number(base, field, low, high, names)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronExpression:
    """A parsed five-field expression; ``CronExpression.parse("0 3 * * *")``."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Monday ... 6 = Sunday (Python's numbering)
    day_restricted: bool
    weekday_restricted: bool
    every_hour: bool

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        """Parse ``text``; :class:`CronError` says which field is wrong and why."""
        if not isinstance(text, str):
            raise CronError(f"a cron expression is a string, not {type(text).__name__}")
        source = text.strip()
        expanded = ALIASES.get(source.lower(), source)
        if expanded.startswith("@"):
            raise CronError(f"unknown alias {source!r}; known: {', '.join(ALIASES)}")
        parts = expanded.split()
        if len(parts) != 5:
            raise CronError(f"{source!r} has {len(parts)} fields; cron needs five: "
                            f"minute hour day-of-month month day-of-week")
        minute, hour, day, month, weekday = (
            _parse_field(part, *spec) for part, spec in zip(parts, _FIELDS, strict=True))
        # cron: 0 and 7 are Sunday; Python: Monday is 0.
        weekdays = frozenset((d - 1) % 7 for d in weekday)
        return cls(text=source, minutes=minute, hours=hour, days=day, months=month,
                   weekdays=weekdays, day_restricted=not parts[2].startswith("*"),
                   weekday_restricted=not parts[4].startswith("*"),
                   every_hour=len(hour) == 24)

    def matches_date(self, date: datetime.date) -> bool:
        """Does the expression fire on ``date`` (cron's rule: when both day fields are
        restricted, either may match)?"""
        if date.month not in self.months:
            return False
        day_ok = date.day in self.days
        weekday_ok = date.weekday() in self.weekdays
        if self.day_restricted and self.weekday_restricted:
            return day_ok or weekday_ok
        return day_ok and weekday_ok

    def _instants_on(self, date: datetime.date, zone: ZoneInfo) -> list[datetime.datetime]:
        """The UTC instants at which the expression fires on local ``date``, in order."""
        found: set[datetime.datetime] = set()
        for hour in sorted(self.hours):
            for minute in sorted(self.minutes):
                wall = datetime.datetime.combine(date, datetime.time(hour, minute))
                first = wall.replace(tzinfo=zone)
                second = wall.replace(tzinfo=zone, fold=1)
                at = first.astimezone(UTC)
                if at.astimezone(zone).replace(tzinfo=None) != wall:  # in a gap
                    if self.every_hour:
                        continue
                    found.add(_end_of_gap(wall, zone))
                    continue
                found.add(at)
                if self.every_hour and second.utcoffset() != first.utcoffset():
                    found.add(second.astimezone(UTC))  # a repeated hour: run in both
        return sorted(found)

    def instants(self, after: datetime.datetime, zone: ZoneInfo | str = "UTC",
                 ) -> Iterator[datetime.datetime]:
        """Every firing instant strictly after ``after`` (aware), in order, as UTC."""
        if isinstance(zone, str):
            zone = get_zone(zone)
        if after.tzinfo is None:
            raise ValueError("after must be an aware datetime")
        date = after.astimezone(zone).date() - datetime.timedelta(days=1)
        for _ in range(_HORIZON_DAYS):
            if self.matches_date(date):
                for at in self._instants_on(date, zone):
                    if at > after:
                        yield at
            date += datetime.timedelta(days=1)

    def next_after(self, after: datetime.datetime,
                   zone: ZoneInfo | str = "UTC") -> datetime.datetime | None:
        """The first firing instant after ``after``, or ``None`` if it never fires
        (``0 0 31 2 *``)."""
        return next(self.instants(after, zone), None)

    def between(self, after: datetime.datetime, until: datetime.datetime,
                zone: ZoneInfo | str = "UTC", *, limit: int = 10_000,
                ) -> list[datetime.datetime]:
        """Firing instants in ``(after, until]``, at most ``limit`` (the newest kept)."""
        found: deque[datetime.datetime] = deque(maxlen=limit)
        for at in self.instants(after, zone):
            if at > until:
                break
            found.append(at)
        return list(found)

    def __str__(self) -> str:
        return self.text


def _end_of_gap(wall: datetime.datetime, zone: ZoneInfo) -> datetime.datetime:
    """The first instant after a spring-forward gap that ``wall`` (a missing time) is in."""
    probe = wall
    for _ in range(24 * 60):
        probe += datetime.timedelta(minutes=1)
        at = probe.replace(tzinfo=zone).astimezone(UTC)
        if at.astimezone(zone).replace(tzinfo=None) == probe:
            return at
    raise CronError(f"no valid time after {wall} in {zone}")
