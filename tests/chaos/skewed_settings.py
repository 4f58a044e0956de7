"""Test settings for a worker whose clock is off by JOBGUARD_CLOCK_SKEW seconds.

Python's clock (``time.time``) and Django's (``timezone.now``) are moved; the database and
Redis keep their own. Lock expiry and job visibility must follow the latter.
"""

import datetime
import os
import time

from django.utils import timezone

from tests.settings import *  # noqa: F401,F403

SKEW = float(os.environ.get("JOBGUARD_CLOCK_SKEW", "0"))
_real_time, _real_now = time.time, timezone.now


def _skewed_time() -> float:
    return _real_time() + SKEW


def _skewed_now() -> datetime.datetime:
    return _real_now() + datetime.timedelta(seconds=SKEW)


time.time = _skewed_time
timezone.now = _skewed_now
