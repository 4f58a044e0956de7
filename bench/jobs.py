"""The jobs the benchmarks run (imported by jobguard workers through autodiscovery)."""

from __future__ import annotations

import asyncio
import time

import redis
from django.conf import settings
from django.db import connection

from django_jobguard import Job


class Noop(Job):
    """Does nothing: what is measured is the queue's own cost per job."""

    name = "bench.Noop"
    queue = "bench"

    def handle(self) -> None:
        return None


class AsyncNoop(Job):
    """Does nothing on the event loop (``jobworker --async-concurrency``): the async path's
    own cost per job."""

    name = "bench.AsyncNoop"
    queue = "bench"

    async def handle(self) -> None:
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


#: Seconds each I/O-bound job waits (bench/io_bound.py): a call to a slow API.
IO_SECONDS = 0.05


class Sleep(Job):
    """Waits like a job calling an HTTP API, blocking its thread (``jobworker --threads``)."""

    name = "bench.Sleep"
    queue = "bench"

    def handle(self) -> None:
        time.sleep(IO_SECONDS)


class AsyncSleep(Job):
    """Waits like a job calling an HTTP API with an async client (``--async-concurrency``)."""

    name = "bench.AsyncSleep"
    queue = "bench"

    async def handle(self) -> None:
        await asyncio.sleep(IO_SECONDS)


_redis: redis.Redis | None = None


def record_latency(sent: float) -> None:
    """Append ``now - sent`` (seconds) to the Redis list bench/steady.py reads (one RPUSH,
    off the database)."""
    global _redis
    started = time.time()
    if _redis is None:
        _redis = redis.Redis.from_url(settings.REDIS_URL)
    _redis.rpush("jgbench:latency", started - sent)  # bench.common.LATENCY_KEY


class LatencyStamp(Job):
    """Records in Redis how long after its dispatch it started (bench/steady.py)."""

    name = "bench.LatencyStamp"
    queue = "bench"

    def __init__(self, sent: float):
        self.sent = sent

    def handle(self) -> None:
        record_latency(self.sent)


class AsyncLatencyStamp(LatencyStamp):
    """The same as an ``async def`` job (``--async-concurrency``)."""

    name = "bench.AsyncLatencyStamp"

    async def handle(self) -> None:
        record_latency(self.sent)


class Finished(Job):
    """Keeps its result: the time ``handle()`` ended, for ``handle.wait()``'s latency."""

    name = "bench.Finished"
    queue = "bench"
    keep_result = True

    def handle(self) -> float:
        return time.time()


#: Redis list where ``TenantStamp`` appends ``"<tenant> <time> <job id>"`` (bench/fairness.py).
SERVED_KEY = "jgbench:served"


class TenantStamp(Job):
    """One tenant's no-op job, whose ``fair_key`` is the tenant: records in Redis which tenant
    was served when (one RPUSH, off the database: bench/fairness.py)."""

    name = "bench.TenantStamp"
    queue = "bench"

    def __init__(self, tenant: str):
        self.tenant = tenant

    def fair_key(self) -> str:
        return self.tenant

    def handle(self) -> None:
        global _redis
        if _redis is None:
            _redis = redis.Redis.from_url(settings.REDIS_URL)
        _redis.rpush(SERVED_KEY, f"{self.tenant} {time.time()} {self.job_id}")
