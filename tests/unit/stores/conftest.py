"""The store tests run on the database, on Redis, and on this session's own Redis Cluster
(3 masters) and Sentinel set (master, replica, sentinel): tests/support/redis_topology.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from django_jobguard import stores
from django_jobguard.conf import jobguard_settings
from tests.support import requires_redis
from tests.support.redis_topology import requires_redis_server, topology_stores


@pytest.fixture(params=[
    "database",
    pytest.param("redis", marks=requires_redis),
    pytest.param("redis-cluster", marks=requires_redis_server),
    pytest.param("redis-sentinel", marks=requires_redis_server),
])
def store_alias(request) -> Iterator[str]:
    """Run the test once per store; the chosen store is also JOBGUARD['STORE']."""
    alias = request.param
    user = dict(jobguard_settings.user_settings)
    extra_stores, caches = {}, {}
    if alias == "redis-cluster":
        extra_stores, caches = topology_stores(request.getfixturevalue("redis_cluster"), None)
    elif alias == "redis-sentinel":
        extra_stores, caches = topology_stores(None, request.getfixturevalue("redis_sentinel"))
    with override_settings(
            JOBGUARD={**user, "STORE": alias, "STORES": {**user.get("STORES", {}),
                                                        **extra_stores}},
            CACHES={**settings.CACHES, **caches}):
        if alias != "database":
            _flush(alias)
        yield alias
        if alias != "database":
            _flush(alias)


def _flush(alias: str) -> None:
    """Remove jobguard's keys (and fencing counters) from the store's Redis."""
    client = stores.get_store(alias).client
    for pattern in ("jobguard:*", "{jobguard:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
