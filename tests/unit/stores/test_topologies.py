"""The Redis store on a Redis Cluster and behind Sentinel: every script's keys in one hash slot,
rate hits spread over slots, a failover, a wrong topology told apart, and the system checks.

The Cluster (3 masters) and the Sentinel set (master, replica, one sentinel) are this test
session's own redis-server processes (tests/support/redis_topology.py); the shared tests in
test_locks.py and test_counters.py run on both too (conftest.py here).
"""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot as redis_key_slot

from django_jobguard.checks import check_settings
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.stores import get_store
from django_jobguard.stores.base import RateWindow
from django_jobguard.stores.redis import (
    RedisStore,
    RedisTopologyError,
    fence_key,
    hash_tag,
    key_slot,
)
from tests.support.redis_topology import requires_redis_server, topology_stores

STORE = "django_jobguard.stores.redis.RedisStore"


# -- keys and slots (no server) -----------------------------------------------------------------

@settings(deadline=None)  # the first odd key computes the table of slot tags (once)
@given(st.text(st.sampled_from("ab{}:x"), max_size=12) | st.text(max_size=30))
def test_a_fence_is_in_its_locks_hash_slot_whatever_the_key(key):
    assert key_slot(key) == redis_key_slot(key.encode())  # Redis's own rule
    assert key_slot(fence_key(key)) == key_slot(key)
    assert fence_key(key) != key


def test_fence_keys_of_jobguards_own_keys_are_readable():
    assert fence_key("jobguard:overlap:app.Job:7") == "{jobguard:overlap:app.Job:7}:fence"
    assert fence_key("jobguard:unique:{tenant-1}:x") == "jobguard:unique:{tenant-1}:x:fence"
    assert hash_tag("a{}b}") == "a{}b}"  # an empty tag hashes the whole key
    odd = "jobguard:overlap:a}b"  # a '}' without a tag: a tag of its slot goes in front
    assert fence_key(odd).endswith(":fence:" + odd) and fence_key(odd).startswith("{")


# -- the Cluster --------------------------------------------------------------------------------

@pytest.fixture
def cluster_store(redis_cluster):
    stores, _ = topology_stores(redis_cluster, None)
    with override_settings(JOBGUARD={"STORES": stores}):
        store = get_store("redis-cluster")
        store.client.flushall()
        yield store
        store.client.flushall()


@requires_redis_server
def test_cluster_locks_spread_over_the_masters_and_keep_their_fences_beside_them(cluster_store):
    client = cluster_store.client
    keys = [f"jobguard:overlap:tests.Spread:{i}" for i in range(30)]
    tokens = [cluster_store.acquire(key, "w1", ttl=60) for key in keys]
    assert all(tokens)
    nodes = {client.get_node_from_key(key).name for key in keys}
    assert len(nodes) == 3  # the locks really are sharded
    for key in keys:  # each fence on the node of its lock, read there
        assert client.get_node_from_key(fence_key(key)).name == \
            client.get_node_from_key(key).name
        assert int(client.get(fence_key(key))) == cluster_store.get_lock(key).token
    assert {info.key for info in cluster_store.locks()} == set(keys)
    assert cluster_store.release(keys[0], "w1")
    assert cluster_store.acquire(keys[0], "w2", ttl=60) > tokens[0]
    # The test clock moves every master's TTLs (testing.travel): all 30 expire.
    assert cluster_store.shorten_ttls(61) == 30 and cluster_store.locks() == []


@requires_redis_server
def test_a_refused_hit_across_slots_gives_back_the_hits_already_made(cluster_store):
    tag = uuid.uuid4().hex
    free, full = f"jobguard:rate:{tag}-a:60s", f"jobguard:rate:{tag}-b:60s"
    while key_slot(free) == key_slot(full):
        tag = uuid.uuid4().hex
        free, full = f"jobguard:rate:{tag}-a:60s", f"jobguard:rate:{tag}-b:60s"
    assert cluster_store.hit_rate_limits([RateWindow(full, 1, 60)]).allowed
    # Whichever slot goes first, the free window must not keep a hit of a refused job.
    for _ in range(3):
        decision = cluster_store.hit_rate_limits([RateWindow(free, 5, 60),
                                                  RateWindow(full, 1, 60)])
        assert not decision.allowed and decision.blocked == (full,)
        assert 59 < decision.retry_after <= 60
    hits = {info.key: info.hits for info in cluster_store.throttles(f"jobguard:rate:{tag}")}
    assert hits == {full: 1}  # the free window gave its hits back (and is empty)
    assert cluster_store.hit_rate_limits([RateWindow(free, 5, 60)]).allowed
    assert {info.key: info.hits
            for info in cluster_store.throttles(f"jobguard:rate:{tag}")} == {full: 1, free: 1}


@requires_redis_server
def test_a_cluster_node_behind_a_plain_cache_is_named_as_the_wrong_topology(redis_cluster):
    caches = {**django_settings.CACHES, "jobguard-node": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_cluster.url + "/0"}}
    with override_settings(CACHES=caches, JOBGUARD={"STORES": {
            "node": {"BACKEND": STORE, "CACHE": "jobguard-node"}}}):
        store = get_store("node")
        # Some key of another master: the node answers MOVED.
        node = store.client.connection_pool.connection_kwargs["port"]
        cluster = RedisStore(alias="c", cluster=redis_cluster.url).client
        key = next(k for k in (f"jobguard:overlap:t:{i}" for i in range(100))
                   if cluster.get_node_from_key(k).port != node)
        with pytest.raises(RedisTopologyError, match="is a Cluster node.*'CLUSTER'"):
            store.acquire(key, "a")
        assert isinstance(RedisTopologyError("x"), ImproperlyConfigured)


@requires_redis_server
def test_a_cluster_url_of_a_plain_server_is_named_as_the_wrong_topology(redis_sentinel):
    url = f"redis://127.0.0.1:{redis_sentinel.master()}"
    with (override_settings(JOBGUARD={"STORES": {"c": {"BACKEND": STORE, "CLUSTER": url}}}),
          pytest.raises(RedisTopologyError, match="is not a Redis Cluster")):
        get_store("c").acquire("jobguard:overlap:t:x", "a")


# -- Sentinel -------------------------------------------------------------------------------------

@requires_redis_server
def test_a_lock_replicated_before_a_failover_holds_after_it(redis_sentinel):
    stores, caches = topology_stores(None, redis_sentinel)
    with override_settings(JOBGUARD={"STORES": stores},
                           CACHES={**django_settings.CACHES, **caches}):
        store = get_store("redis-sentinel")
        key = f"jobguard:overlap:tests.Failover:{uuid.uuid4().hex}"
        token = store.acquire(key, "w1", ttl=60)
        assert token
        assert store.client.wait(1, 5000) == 1  # on the replica too (WAIT)
        old = redis_sentinel.master()
        new = redis_sentinel.failover()
        assert new != old
        # The pool's connection to the old master (a replica now) is an outage, not a crash:
        # it reconnects to the master the sentinel names.
        try:
            info = store.get_lock(key)
        except StoreUnavailableError:
            info = store.get_lock(key)
        assert store.client.connection_pool.get_master_address()[1] == new
        assert (info.owner, info.token) == ("w1", token)
        assert store.acquire(key, "w2", ttl=60) is None  # still exclusive
        assert not store.release(key, "w2")
        assert store.release(key, "w1")
        assert store.acquire(key, "w2", ttl=60) > token  # fencing keeps its order


# -- system checks --------------------------------------------------------------------------------

def _check(stores: dict, caches: dict | None = None, **extra) -> list:
    with override_settings(JOBGUARD={"STORES": stores}, CACHES={**django_settings.CACHES,
                                                                **(caches or {})}, **extra):
        return [e for e in check_settings() if e.id.startswith(("jobguard.E14",
                                                                "jobguard.W14"))]


def _sentinel(**options) -> dict:
    """A Sentinel cache entry (never connected to) with ``options`` changed (None: left out)."""
    cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://mymaster/0",
             "OPTIONS": {"CLIENT_CLASS": "django_redis.client.SentinelClient",
                         "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                         "SENTINELS": [("s1", 26379), ("s2", 26379), ("s3", 26379)]}}
    for name, value in options.items():
        if value is None:
            cache["OPTIONS"].pop(name)
        else:
            cache["OPTIONS"][name] = value
    return cache


@pytest.mark.parametrize(("config", "message"), [
    ({"CLUSTER": "redis://n1:7000", "CACHE": "default"}, "sets both 'CACHE' and 'CLUSTER'"),
    ({"CLUSTER": "n1:7000"}, "must be a redis:// URL"),
    ({"CLUSTER": []}, "non-empty list"),
    ({"CLUSTER": ["redis://n1:7000", "redis://n2:x"]}, "'redis://n2:x'"),
    ({"CLUSTER": "redis://n1:7000/3"}, "database number"),
    ({"CLUSTER": "redis://n1:7000", "CLUSTER_OPTIONS": ["x"]}, "CLUSTER_OPTIONS"),
])
def test_a_bad_cluster_setting_is_e140(config, message):
    errors = _check({"locks": {"BACKEND": STORE, **config}})
    assert [e.id for e in errors] == ["jobguard.E140"]
    assert message in errors[0].msg + (errors[0].hint or "")


def test_good_topologies_pass_the_checks():
    assert _check({"c": {"BACKEND": STORE, "CLUSTER": ["redis://n1:7000", "rediss://n2:7001/0"]},
                   "s": {"BACKEND": STORE, "CACHE": "sentinel"}},
                  {"sentinel": _sentinel()}) == []


def test_client_side_sharding_is_e141():
    caches = {"sharded": {"BACKEND": "django_redis.cache.RedisCache",
                          "LOCATION": ["redis://a:6379/0", "redis://b:6379/0"],
                          "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardedClient"}}}
    errors = _check({"s": {"BACKEND": STORE, "CACHE": "sharded"}}, caches)
    assert [e.id for e in errors] == ["jobguard.E141"] and "fencing counter" in errors[0].msg


@pytest.mark.parametrize(("options", "message"), [
    ({"CONNECTION_FACTORY": None}, "connection factory is 'the default'"),
    ({"CLIENT_CLASS": None}, "CLIENT_CLASS is not"),
    ({"SENTINELS": None}, "SENTINELS"),
])
def test_a_sentinel_set_up_wrongly_is_e142(options, message):
    errors = _check({"s": {"BACKEND": STORE, "CACHE": "sentinel"}},
                    {"sentinel": _sentinel(**options)})
    assert [e.id for e in errors] == ["jobguard.E142"] and message in errors[0].msg


def test_the_global_sentinel_factory_counts_and_a_replica_location_does_not():
    cache = _sentinel(CONNECTION_FACTORY=None)
    assert _check({"s": {"BACKEND": STORE, "CACHE": "sentinel"}}, {"sentinel": cache},
                  DJANGO_REDIS_CONNECTION_FACTORY="django_redis.pool."
                                                  "SentinelConnectionFactory") == []
    errors = _check({"s": {"BACKEND": STORE, "CACHE": "sentinel"}},
                    {"sentinel": {**cache, "LOCATION": "redis://m/0?is_master=0"}},
                    DJANGO_REDIS_CONNECTION_FACTORY="django_redis.pool."
                                                    "SentinelConnectionFactory")
    assert [e.id for e in errors] == ["jobguard.E142"] and "naming the master" in errors[0].msg


def test_fewer_than_three_sentinels_is_w140():
    cache = _sentinel(SENTINELS=[("s1", 26379)])
    errors = _check({"s": {"BACKEND": STORE, "CACHE": "sentinel"}}, {"sentinel": cache})
    assert [e.id for e in errors] == ["jobguard.W140"] and "1 sentinel(s)" in errors[0].msg


@pytest.mark.slow
@requires_redis_server
def test_a_cluster_master_down_is_a_store_outage_not_a_crash():
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from tests.support.redis_topology import Cluster

    cluster = Cluster().start()  # its own: this test stops one of its masters
    try:
        store = RedisStore(alias="own-cluster", cluster=cluster.url, cluster_options={
            "socket_connect_timeout": 1, "socket_timeout": 2, "retry": Retry(NoBackoff(), 1)})
        keys = [f"jobguard:overlap:tests.Down:{i}" for i in range(30)]
        assert all(store.acquire(key, "w1", ttl=60) for key in keys)
        victim = cluster.ports[1]
        on_victim = next(k for k in keys if store.client.get_node_from_key(k).port == victim)
        cluster.procs[1].terminate()
        cluster.procs[1].wait()
        # Its slots first refuse connections, then the others answer CLUSTERDOWN: both are
        # outages (the worker puts the job back without using an attempt).
        for key in (on_victim, next(k for k in keys if k != on_victim)):
            with pytest.raises(StoreUnavailableError, match="own-cluster"):
                store.get_lock(key)
    finally:
        cluster.stop()


@requires_redis_server
def test_a_store_with_only_a_warning_is_still_listed_for_operators(redis_sentinel):
    from django_jobguard.operations import usable_stores

    stores, caches = topology_stores(None, redis_sentinel)  # one sentinel: W140
    bad = {"BACKEND": STORE, "CLUSTER": "n1:7000"}  # E140
    with override_settings(JOBGUARD={"STORES": {**stores, "bad": bad}},
                           CACHES={**django_settings.CACHES, **caches}):
        assert [e.id for e in RedisStore.check_config("redis-sentinel", stores[
            "redis-sentinel"])] == ["jobguard.W140"]
        assert "redis-sentinel" in usable_stores() and "bad" not in usable_stores()
