"""The jobs the benchmarks run (imported by jobguard workers through autodiscovery)."""

from __future__ import annotations

import time

from django.db import connection

from django_jobguard import Job


class Noop(Job):
    """Does nothing: what is measured is the queue's own cost per job."""

    name = "bench.Noop"
    queue = "bench"

    def handle(self) -> None:
        return None


class Stamp(Job):
    """Records when ``handle()`` started next to when the caller dispatched it (latency)."""

    name = "bench.Stamp"
    queue = "bench"

    def __init__(self, sent: float):
        self.sent = sent

    def handle(self) -> None:
        started = time.time()
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_latency (sent, started) VALUES (%s, %s)",
                           [self.sent, started])
