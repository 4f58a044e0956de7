"""``clock.now()``: Python's now as Django's ``timezone.now()`` gives it (the zone that
``USE_TZ`` asks for, read once and again when the setting changes), a test's patch of
``timezone.now`` honoured, plus the test clock's offset."""

from __future__ import annotations

import datetime
from unittest import mock

from django.test import override_settings
from django.utils import timezone

from django_jobguard import clock


def test_now_is_aware_utc_with_use_tz_and_naive_without():
    assert clock.now().tzinfo is datetime.UTC
    with override_settings(USE_TZ=False):
        assert clock.now().tzinfo is None
        assert abs(clock.now() - timezone.now()) < datetime.timedelta(seconds=5)
    assert clock.now().tzinfo is datetime.UTC


def test_a_patched_timezone_now_is_what_now_reads():
    fixed = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    with mock.patch("django.utils.timezone.now", return_value=fixed):
        assert clock.now() == fixed


def test_the_test_clock_offset_is_added():
    before = clock.now()
    clock.set_offset(3600)
    try:
        assert clock.now() - before >= datetime.timedelta(seconds=3599)
    finally:
        clock.set_offset(0)
