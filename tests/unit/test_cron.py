"""Cron expressions: parsing, matching, time zones and daylight-saving changes."""

from __future__ import annotations

import datetime

import pytest

from django_jobguard.cron import CronError, CronExpression

UTC = datetime.UTC
BERLIN = "Europe/Berlin"


def at(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


@pytest.mark.parametrize("text, message", [
    ("* * * *", "has 4 fields"),
    ("60 * * * *", "minute: 60 is outside 0-59"),
    ("* 24 * * *", "hour: 24 is outside 0-23"),
    ("* * 0 * *", "day of month: 0 is outside 1-31"),
    ("* * * 13 *", "month: 13 is outside 1-12"),
    ("* * * * 8", "day of week: 8 is outside 0-7"),
    ("*/0 * * * *", "step '0' must be a whole number above 0"),
    ("5-1 * * * *", "range '5-1' runs backwards"),
    ("a * * * *", "minute: 'a' is not a number"),
    ("1,,2 * * * *", "empty item"),
    ("@reboot", "unknown alias '@reboot'"),
    ("* * * foo *", "or a name (jan"),
])
def test_bad_expressions_say_what_is_wrong(text, message):
    with pytest.raises(CronError, match=message.replace("(", r"\(").replace("*", r"\*")):
        CronExpression.parse(text)


def test_fields_lists_ranges_steps_and_names():
    c = CronExpression.parse("0,30 9-17/4 * jan-mar mon-fri")
    assert c.minutes == {0, 30} and c.hours == {9, 13, 17}
    assert c.months == {1, 2, 3} and c.weekdays == {0, 1, 2, 3, 4}
    assert CronExpression.parse("5/20 * * * *").minutes == {5, 25, 45}
    sunday = CronExpression.parse("* * * * 0").weekdays
    assert sunday == CronExpression.parse("* * * * 7").weekdays == {6}


@pytest.mark.parametrize("alias, plain", [
    ("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
])
def test_aliases(alias, plain):
    start = at(2026, 5, 17, 10, 7)
    a, b = CronExpression.parse(alias), CronExpression.parse(plain)
    assert a.between(start, start + datetime.timedelta(days=400)) == \
        b.between(start, start + datetime.timedelta(days=400))


def test_next_after_is_strictly_after():
    c = CronExpression.parse("*/5 * * * *")
    assert c.next_after(at(2026, 1, 1, 10, 0)) == at(2026, 1, 1, 10, 5)
    assert c.next_after(at(2026, 1, 1, 10, 3, 59)) == at(2026, 1, 1, 10, 5)


def test_day_of_month_or_day_of_week_when_both_restricted():
    c = CronExpression.parse("0 0 13 * fri")  # the 13th, or any Friday (cron's rule)
    days = [t.date() for t in c.between(at(2026, 2, 1), at(2026, 3, 31))]
    assert datetime.date(2026, 2, 6) in days  # a Friday, not the 13th
    assert datetime.date(2026, 3, 13) in days  # the 13th (also a Friday)
    assert datetime.date(2026, 4, 13) not in days
    only_fridays = CronExpression.parse("0 0 * * fri")
    assert all(t.weekday() == 4 for t in only_fridays.between(at(2026, 2, 1), at(2026, 3, 31)))


def test_never_firing_expression_has_no_next():
    assert CronExpression.parse("0 0 31 2 *").next_after(at(2026, 1, 1)) is None


def test_leap_day():
    assert CronExpression.parse("0 12 29 2 *").next_after(at(2026, 3, 1)) == at(2028, 2, 29, 12)


def test_time_zone():
    c = CronExpression.parse("0 3 * * *")
    assert c.next_after(at(2026, 7, 1), BERLIN) == at(2026, 7, 1, 1)  # CEST = UTC+2
    assert c.next_after(at(2026, 1, 1), BERLIN) == at(2026, 1, 1, 2)  # CET = UTC+1


# Europe/Berlin: 2026-03-29 02:00 CET jumps to 03:00 CEST (01:00 UTC);
# 2026-10-25 03:00 CEST falls back to 02:00 CET (01:00 UTC).

def test_spring_forward_missing_time_runs_once_after_the_gap():
    c = CronExpression.parse("30 2 * * *")
    ticks = c.between(at(2026, 3, 27), at(2026, 3, 31), BERLIN)
    assert ticks == [at(2026, 3, 27, 1, 30), at(2026, 3, 28, 1, 30),
                     at(2026, 3, 29, 1, 0),  # 02:30 does not exist: at 03:00 CEST, once
                     at(2026, 3, 30, 0, 30)]


def test_spring_forward_several_missing_times_collapse_into_one_run():
    c = CronExpression.parse("0,15,30,45 2 * * *")
    night = c.between(at(2026, 3, 28, 22), at(2026, 3, 29, 6), BERLIN)
    assert night == [at(2026, 3, 29, 1, 0)]


def test_spring_forward_hourly_schedule_skips_the_missing_hour():
    c = CronExpression.parse("*/30 * * * *")
    night = c.between(at(2026, 3, 29, 0, 0), at(2026, 3, 29, 2, 0), BERLIN)
    # 01:30 CET (00:30 UTC), then 03:00 CEST (01:00 UTC): no phantom 02:xx runs.
    assert night == [at(2026, 3, 29, 0, 30), at(2026, 3, 29, 1, 0), at(2026, 3, 29, 1, 30),
                     at(2026, 3, 29, 2, 0)]


def test_fall_back_repeated_time_runs_once():
    c = CronExpression.parse("30 2 * * *")
    ticks = c.between(at(2026, 10, 24), at(2026, 10, 27), BERLIN)
    assert ticks == [at(2026, 10, 24, 0, 30),  # CEST
                     at(2026, 10, 25, 0, 30),  # the first 02:30 (CEST) only
                     at(2026, 10, 26, 1, 30)]  # CET


def test_fall_back_hourly_schedule_runs_in_both_hours():
    c = CronExpression.parse("0 * * * *")
    night = c.between(at(2026, 10, 24, 23, 30), at(2026, 10, 25, 2, 30), BERLIN)
    assert night == [at(2026, 10, 25, 0), at(2026, 10, 25, 1), at(2026, 10, 25, 2)]


def test_unknown_time_zone():
    with pytest.raises(CronError, match="unknown time zone 'Mars/Olympus'"):
        CronExpression.parse("* * * * *").next_after(at(2026, 1, 1), "Mars/Olympus")


def test_between_keeps_the_newest_when_limited():
    c = CronExpression.parse("* * * * *")
    assert c.between(at(2026, 1, 1), at(2026, 1, 1, 1), limit=2) == [
        at(2026, 1, 1, 0, 59), at(2026, 1, 1, 1)]
