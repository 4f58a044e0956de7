"""procrastinate's no-op task on the bench database (a peer in bench/peers.py)."""

import asyncio
import os

import procrastinate

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
