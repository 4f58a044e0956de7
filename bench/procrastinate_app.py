"""procrastinate's no-op task on the bench database (a peer in bench/peers.py)."""

import asyncio
import os
import time

import procrastinate
import redis

app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=os.environ.get("JOBGUARD_BENCH_CONNINFO", "")))


@app.task(name="bench.noop", queue="jgbench")
def noop() -> None:
    return None


@app.task(name="bench.anoop", queue="jgbench")
async def anoop() -> None:
    return None


@app.task(name="bench.asleep", queue="jgbench")
async def asleep() -> None:
    """Waits 50 ms like an HTTP call with an async client (bench/io_bound.py)."""
    await asyncio.sleep(0.05)


_client: redis.Redis | None = None


@app.task(name="bench.astamp", queue="jgbench")
async def astamp(sent: float) -> None:
    """Records in Redis how long after its dispatch it started (bench/steady.py)."""
    global _client
    started = time.time()
    if _client is None:
        _client = redis.Redis.from_url(os.environ.get("JOBGUARD_BENCH_REDIS_URL",
                                                      "redis://127.0.0.1:6379/0"))
    _client.rpush("jgbench:latency", started - sent)  # bench.common.LATENCY_KEY
