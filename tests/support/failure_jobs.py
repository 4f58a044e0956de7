"""Jobs that fail in each way a job's retries can end (tests/test_failure_reasons.py)."""

from __future__ import annotations

import datetime
import time

from django.utils import timezone

from django_jobguard import Job, ThrottlesExceptions


class ServiceDown(Exception):
    """What a flaky provider's client raises."""


class CallsTwilio(Job):
    """Raises ServiceDown on every run: the provider answers 503."""

    tries = 2

    def handle(self):
        raise ServiceDown("Twilio: 503 Service Unavailable")


class CallsTwilioMaxExceptions(CallsTwilio):
    tries = 5
    max_exceptions = 2


class CallsTwilioThroughCircuit(CallsTwilio):
    """Behind a circuit that one failure opens, shared under the name ``twilio-api``."""

    def middleware(self):
        return [ThrottlesExceptions(max_attempts=1, decay_seconds=600, backoff=30)
                .by("twilio-api")]


class CallsTwilioUntil(CallsTwilioThroughCircuit):
    """Retried until a deadline instead of a number of tries."""

    tries = 0

    def retry_until(self):
        return timezone.now() + datetime.timedelta(minutes=5)


class SlowSms(Job):
    tries = 1
    timeout = 0.3

    def handle(self):
        time.sleep(5)


class SlowSmsFailOnTimeout(SlowSms):
    tries = 3
    fail_on_timeout = True
