"""Schedules that only worker subprocesses declare (``JOBGUARD_EXTRA_JOB_MODULES``), so the
in-process tests see no periodic jobs they did not ask for."""

from __future__ import annotations

from django_jobguard import periodic
from tests.support.jobs import Record

periodic("* * * * *", name="race-all", args=["race-all"], catch_up="all")(Record)
periodic("* * * * *", name="race-last", args=["race-last"], catch_up="last")(Record)
