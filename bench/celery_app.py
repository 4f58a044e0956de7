"""celery's no-op task with a Redis broker (a peer in bench/peers.py).

celery has no queue table to watch, so the task counts itself done with one Redis INCR.
"""

import os
import time

import redis
from celery import Celery

BROKER = os.environ.get("JOBGUARD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = "jgbench"
DONE_KEY = "jgbench:celery:done"

app = Celery("jgbench", broker=BROKER)
app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True, task_default_queue=QUEUE)
_client: redis.Redis | None = None


@app.task(name="bench.noop")
def noop() -> None:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(BROKER)
    _client.incr(DONE_KEY)


@app.task(name="bench.sleep")
def sleep() -> None:
    """Waits 50 ms like an HTTP call (bench/io_bound.py, ``--pool threads``)."""
    global _client
    time.sleep(0.05)
    if _client is None:
        _client = redis.Redis.from_url(BROKER)
    _client.incr(DONE_KEY)


@app.task(name="bench.stamp")
def stamp(sent: float) -> None:
    """Records in Redis how long after its dispatch it started (bench/steady.py)."""
    global _client
    started = time.time()
    if _client is None:
        _client = redis.Redis.from_url(BROKER)
    _client.rpush("jgbench:latency", started - sent)  # bench.common.LATENCY_KEY
