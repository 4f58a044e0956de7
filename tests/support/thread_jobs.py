"""Jobs for the ``--threads`` tests; worker subprocesses import this module through
tests.settings."""

from __future__ import annotations

import time

from django_jobguard import Job
from tests.support.lock_jobs import record


class SleepInC(Job):
    """Records its start, then sleeps in C code: nothing can interrupt it before it returns."""

    timeout = 1
    tries = 2
    backoff = 30

    def __init__(self, label: str, seconds: float = 20):
        self.label, self.seconds = label, seconds

    def handle(self):
        record(self, self.label)
        time.sleep(self.seconds)


class Spin(Job):
    """Records its start, then loops in Python until its timeout interrupts it."""

    timeout = 1
    tries = 1

    def __init__(self, label: str):
        self.label = label

    def handle(self):
        record(self, self.label)
        while True:
            sum(range(1000))
