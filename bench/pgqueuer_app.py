"""PgQueuer's no-op and latency-stamp entrypoints on the bench database (a peer in
bench/peers.py and bench/steady.py).

Started as ``pgq run bench.pgqueuer_app:main --batch-size N`` would start it:
``python -m bench.pgqueuer_app --batch-size N`` calls ``pgqueuer.run()``, its documented
programmatic equivalent of ``pgq run``, on uvloop as the CLI does. (``pgq run`` of PgQueuer
1.6.0 fails at start with typer 0.29: ``'str' object has no attribute 'name'`` in its logging
set-up.) Configured as PgQueuer's documentation recommends for throughput: the asyncpg driver
on one dedicated connection for the QueueManager (its LISTEN channel included), ``pgq
autovac`` applied after ``pgq install`` (bench/peers.py does both), and a larger
``--batch-size`` for short jobs (bench/peers.py runs 10, its default, and
``JOBGUARD_BENCH_PGQUEUER_BATCH``, default 100).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
import redis
import uvloop
from pgqueuer import PgQueuer
from pgqueuer.models import Job

NOOP = "bench_noop"
STAMP = "bench_stamp"
#: Redis list the stamp entrypoint appends ``started - sent`` (seconds) to (bench/steady.py).
LATENCY_KEY = "jgbench:latency"  # bench.common.LATENCY_KEY


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` calls: one asyncpg connection, two entrypoints."""
    connection = await asyncpg.connect(
        os.environ["JOBGUARD_BENCH_DSN"],
        server_settings={"application_name": os.environ.get("PGAPPNAME", "jgbench")})
    pgq = PgQueuer.from_asyncpg_connection(connection)
    client = redis.Redis.from_url(os.environ.get("JOBGUARD_BENCH_REDIS_URL",
                                                 "redis://127.0.0.1:6379/0"))

    @pgq.entrypoint(NOOP)
    async def noop(job: Job) -> None:
        return None

    @pgq.entrypoint(STAMP)
    async def stamp(job: Job) -> None:
        started = time.time()
        client.rpush(LATENCY_KEY, started - float(job.payload or b"0"))

    try:
        yield pgq
    finally:
        await connection.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    uvloop.run(pgqueuer.run("bench.pgqueuer_app:main", batch_size=args.batch_size))
