"""Oban for Python's no-op and latency-stamp workers on the bench database (a peer in
bench/peers.py and bench/steady.py). Oban needs Python >= 3.12: this module runs only in the
venv that ``bench/peers.py`` builds for it (``bench/.cache/oban-venv``), never in the bench's
own interpreter.

- Workers: ``oban start --dsn … --queues burn:10`` (its CLI) resolves ``bench.oban_app.Noop``
  and ``bench.oban_app.Stamp`` by importing this module.
- Producers: ``python -m bench.oban_app fill N`` inserts N no-op jobs with
  ``Oban.enqueue_many`` in one transaction (all visible at once, as the other tools' fills);
  ``python -m bench.oban_app steady RATE SECONDS [TASKS]`` enqueues stamp jobs one by one at
  RATE per second from TASKS concurrent tasks, each job carrying the time just before its
  ``enqueue``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import redis
from oban import Oban, worker

QUEUE = "burn"
#: Redis list the stamp worker appends ``started - sent`` (seconds) to (bench/steady.py).
LATENCY_KEY = "jgbench:latency"  # bench.common.LATENCY_KEY
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ.get("JOBGUARD_BENCH_REDIS_URL",
                                                      "redis://127.0.0.1:6379/0"))
    return _client


@worker(queue=QUEUE)
class Noop:
    """Does nothing: what is measured is the queue's own cost per job."""

    async def process(self, job):  # noqa: ANN001, ANN201 (Oban's worker protocol)
        return None


@worker(queue=QUEUE)
class Stamp:
    """Records how long after its dispatch it started (bench/steady.py)."""

    async def process(self, job):  # noqa: ANN001, ANN201
        started = time.time()
        _redis().rpush(LATENCY_KEY, started - job.args["sent"])


async def _fill(n: int, dsn: str, chunk: int = 5_000) -> None:
    pool = await Oban.create_pool(dsn, min_size=1, max_size=1)
    oban = Oban(pool=pool)
    try:
        async with pool.connection() as conn, conn.transaction():
            for start in range(0, n, chunk):
                await oban.enqueue_many([Noop.new({}) for _ in range(min(chunk, n - start))],
                                        conn=conn)
    finally:
        await pool.close()


async def _steady(rate: float, seconds: float, dsn: str, tasks: int) -> None:
    pool = await Oban.create_pool(dsn, min_size=tasks, max_size=tasks)
    oban = Oban(pool=pool)
    count = max(int(rate * seconds), 1)
    t0 = time.perf_counter() + 0.05

    async def loop(first: int) -> None:
        for i in range(first, count, tasks):
            pause = t0 + i / rate - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            await oban.enqueue(Stamp.new({"sent": time.time()}))

    try:
        await asyncio.gather(*(loop(k) for k in range(tasks)))
        print(f"sent {count} in {time.perf_counter() - t0:.3f}", flush=True)
    finally:
        await pool.close()


if __name__ == "__main__":
    # Run as a script, this file is __main__; jobs must name the workers by the module path
    # the ``oban start`` processes import, so the producers use the imported module's classes.
    import bench.oban_app as app

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    fill = sub.add_parser("fill")
    fill.add_argument("jobs", type=int)
    steady = sub.add_parser("steady")
    steady.add_argument("rate", type=float)
    steady.add_argument("seconds", type=float)
    steady.add_argument("tasks", type=int, nargs="?", default=1, help="concurrent producers")
    args = parser.parse_args()
    if args.command == "fill":
        asyncio.run(app._fill(args.jobs, args.dsn))
    else:
        asyncio.run(app._steady(args.rate, args.seconds, args.dsn, args.tasks))
