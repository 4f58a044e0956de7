"""Shared fixtures. The database comes from the environment (see testproject/settings.py):
SQLite by default, PostgreSQL with JOBGUARD_TEST_DATABASE_URL; the Redis store with
JOBGUARD_REDIS_URL. Multi-process tests start real ``manage.py jobworker`` processes against
the test database through :func:`workers`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_jobguard import stores
from django_jobguard.conf import jobguard_settings
from tests.support import REDIS_URL, WorkerPool, requires_redis, start_workers


def pytest_report_header(config):
    return (f"jobguard: database={os.environ.get('JOBGUARD_TEST_DATABASE_URL') or 'sqlite'} "
            f"redis={REDIS_URL or 'off'}")


@pytest.fixture(autouse=True)
def _fresh_stores():
    stores.reset()
    yield
    stores.reset()


@pytest.fixture(scope="session")
def redis_cluster():
    """A 3-master Redis Cluster of this test session (tests/support/redis_topology.py)."""
    from tests.support.redis_topology import SERVER, Cluster

    if not SERVER:
        pytest.skip("needs Debian's redis-server")
    cluster = Cluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel():
    """A Redis master, its replica and a sentinel of this test session."""
    from tests.support.redis_topology import SERVER, Sentinel

    if not SERVER:
        pytest.skip("needs Debian's redis-server")
    sentinel = Sentinel().start()
    yield sentinel
    sentinel.stop()


@pytest.fixture
def released() -> Iterator[list[dict]]:
    """The keyword arguments of every ``job_released`` signal sent during the test."""
    from django_jobguard import signals

    seen: list[dict] = []

    def receiver(**kwargs):
        seen.append(kwargs)

    signals.job_released.connect(receiver)
    yield seen
    signals.job_released.disconnect(receiver)


@pytest.fixture
def scratch_jobs():
    """Job classes a test defines on the fly are unregistered after it."""
    from django_jobguard import registry

    before = set(registry.all_jobs())
    yield
    for name in set(registry.all_jobs()) - before:
        registry.unregister(name)


@pytest.fixture(params=["database", pytest.param("redis", marks=requires_redis)])
def store_alias(request) -> Iterator[str]:
    """Run the test once per store; the chosen store is also JOBGUARD['STORE']."""
    alias = request.param
    with override_settings(JOBGUARD={**_user_settings(), "STORE": alias}):
        if alias == "redis":
            _flush_redis()
        yield alias
        if alias == "redis":
            _flush_redis()


def _user_settings() -> dict:
    return dict(jobguard_settings.user_settings)


def _flush_redis() -> None:
    client = stores.get_store("redis").client
    for pattern in ("jobguard:*", "{jobguard:*"):  # keys, and the fencing counters of locks
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)


@pytest.fixture
def workers(transactional_db) -> Iterator:
    """``workers(n, *args)`` starts real worker processes on the committed test database."""
    pools: list[WorkerPool] = []

    def start(n: int, *args: str, env: dict[str, str] | None = None) -> WorkerPool:
        pool = start_workers(n, *args, env=env)
        pools.append(pool)
        return pool

    yield start
    for pool in pools:
        pool.kill()


@pytest.fixture
def loop_connections():
    """Close the connections the worker loop's threads opened (a test on the worker's loop
    is a transaction=True one: its threads see the rows), before the test's flush."""
    import asyncio
    import threading

    from asgiref.sync import sync_to_async
    from django.db import connections

    from django_jobguard import aio

    yield
    loop = aio._loop_thread
    if loop is None:
        return
    count = len(loop.pool._threads)
    barrier = threading.Barrier(count) if count else None

    def close():
        assert barrier is not None
        barrier.wait(timeout=5)  # one call in each thread
        connections.close_all()

    async def all_closed():
        if count:
            await asyncio.gather(*(aio.call_sync(close) for _ in range(count)))
        await sync_to_async(connections.close_all, thread_sensitive=True)()

    loop.run(all_closed())
