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
from redis.exceptions import ResponseError

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
from tests.support import requires_redis
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


# -- a store's PREFIX and the tests' journal, on every topology ----------------------------------

PREFIX = "unit-prefix:"


@pytest.fixture(params=[
    pytest.param("redis", marks=requires_redis),
    pytest.param("redis-cluster", marks=requires_redis_server),
    pytest.param("redis-sentinel", marks=requires_redis_server),
])
def prefixed(request):
    """A store with ``PREFIX`` on one server, a Cluster or behind Sentinel (built from
    settings, as a project's would be)."""
    if request.param == "redis":
        config, caches = {"BACKEND": STORE, "CACHE": get_store("redis").cache_alias}, {}
    elif request.param == "redis-cluster":
        stores, caches = topology_stores(request.getfixturevalue("redis_cluster"), None)
        config = stores["redis-cluster"]
    else:
        stores, caches = topology_stores(None, request.getfixturevalue("redis_sentinel"))
        config = stores["redis-sentinel"]
    with override_settings(JOBGUARD={"STORES": {"p": {**config, "PREFIX": PREFIX}}},
                           CACHES={**django_settings.CACHES, **caches}):
        store = get_store("p")
        assert store.prefix == PREFIX
        _forget_prefixed(store)
        yield store
        _forget_prefixed(store)


def _forget_prefixed(store) -> None:
    client = store.client
    for pattern in (f"{PREFIX}*", f"{{{PREFIX}*"):  # keys, and the fences of locks
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)


def _stored_everywhere(store) -> set[str]:
    client = store.client
    return {k.decode() for pattern in (f"{PREFIX}*", f"{{{PREFIX}*", "jobguard:*",
                                       "{jobguard:*")
            for k in client.scan_iter(match=pattern, count=1000)}


def _slots(store, keys) -> set[int]:
    """The hash slots of ``keys`` as the server itself computes them (one slot without a
    Cluster)."""
    if not store.is_cluster:
        return {0}
    return {int(store.client.cluster_keyslot(key)) for key in keys}


def test_a_prefixed_store_writes_everything_under_its_prefix_and_the_journal_undoes_it(
        prefixed):
    from django_jobguard.stores.journal import recording

    store, client = prefixed, prefixed.client
    locks = [f"jobguard:overlap:tests.Prefixed:{i}" for i in range(12)]
    # Two windows in different slots as stored (with the prefix): the hit crosses slots.
    tag = uuid.uuid4().hex
    free, full = f"jobguard:rate:{tag}-a:60s", f"jobguard:rate:{tag}-b:60s"
    while key_slot(PREFIX + free) == key_slot(PREFIX + full):
        tag = uuid.uuid4().hex
        free, full = f"jobguard:rate:{tag}-a:60s", f"jobguard:rate:{tag}-b:60s"
    with recording():
        tokens = {key: store.acquire(key, "w1", ttl=60) for key in locks}
        assert all(tokens.values())
        for key in locks:  # the lock and its fence under the prefix, in one slot
            stored = PREFIX + key
            assert client.exists(stored) == 1 and client.exists(key) == 0
            assert fence_key(stored).startswith("{" + PREFIX)
            assert int(client.get(fence_key(stored))) == tokens[key]
            assert len(_slots(store, [stored, fence_key(stored)])) == 1
            assert store.get_lock(key).token == tokens[key]
        if store.is_cluster:  # the locks really are spread over the masters
            assert len({client.get_node_from_key(PREFIX + key).name for key in locks}) == 3
        assert sorted(info.key for info in store.locks()) == sorted(locks)
        page, seen = store.lock_page(limit=5), set()
        while True:
            seen |= {info.key for info in page.locks}
            if not page.cursor:
                break
            page = store.lock_page(cursor=page.cursor, limit=5)
        assert seen == set(locks)  # every page's keys without the prefix

        assert store.hit_rate_limits([RateWindow(full, 1, 60)]).allowed
        for _ in range(3):  # refused; the free window's hit is given back (prefixed keys)
            decision = store.hit_rate_limits([RateWindow(free, 5, 60), RateWindow(full, 1, 60)])
            assert not decision.allowed and decision.blocked == (full,)
        hits = {info.key: info.hits for info in store.throttles(f"jobguard:rate:{tag}")}
        assert hits == {full: 1}
        circuit = f"jobguard:circuit:{tag}"
        store.circuit_leave(circuit, owner="w1", outcome="failure", max_attempts=3, decay=60)
        assert client.exists(PREFIX + circuit) == 1
        written = _stored_everywhere(store)
        assert not {key for key in written if key.startswith("jobguard:")}  # nothing unprefixed
        if store.is_cluster:  # the undo below deletes over many slots
            assert len(_slots(store, written)) > 3
    assert _stored_everywhere(store) == set()  # closing the scope deleted all of it


@requires_redis_server
def test_the_journal_on_a_cluster_deletes_slot_by_slot(redis_cluster):
    store = RedisStore(alias="c", cluster=redis_cluster.url, prefix=PREFIX)
    keys = [f"{PREFIX}jobguard:rate:spread-{i}" for i in range(20)]
    for key in keys:
        store.client.set(key, "rate|1|1|")
    assert len({key_slot(key) for key in keys}) > 1
    with pytest.raises(ResponseError, match="same slot"):  # one DEL of them all: CROSSSLOT
        store.client.execute_command("DEL", *keys, target_nodes=store.client.get_random_node())
    assert store.delete_keys(keys) == len(keys)
    assert [k for k in keys if store.client.exists(k)] == []


@requires_redis_server
@settings(deadline=None, max_examples=60)
@given(prefix=st.text(st.characters(blacklist_characters="{}", blacklist_categories=("Cs",)),
                      max_size=10),
       key=st.text(st.sampled_from("ab{}:x"), min_size=1, max_size=12) | st.text(min_size=1,
                                                                                  max_size=30))
def test_on_a_real_cluster_a_prefixed_lock_and_its_fence_share_a_slot(redis_cluster, prefix,
                                                                       key):
    store = _cluster_store_with(redis_cluster.url, prefix)
    client = store.client
    stored = prefix + key
    # The server's own slots: the lock and its fence are in one, so the script runs at all.
    assert int(client.cluster_keyslot(stored)) == int(client.cluster_keyslot(fence_key(stored)))
    if hash_tag(key) != key:  # a key's own hash tag stays its tag behind the prefix
        assert int(client.cluster_keyslot(stored)) == key_slot(key)
    token = store.acquire(key, "me", ttl=60)
    try:
        assert token and store.get_lock(key).token == token
        assert int(client.get(fence_key(stored))) == token
    finally:
        client.delete(stored)
        client.delete(fence_key(stored))


_CLUSTER_STORES: dict[tuple[str, str], RedisStore] = {}


def _cluster_store_with(url: str, prefix: str) -> RedisStore:
    """One store per prefix for the examples above (one connection pool per example is slow)."""
    base = _CLUSTER_STORES.get((url, ""))
    if base is None:
        base = _CLUSTER_STORES[(url, "")] = RedisStore(alias="c", cluster=url)
    store = RedisStore(alias="c", cluster=url, prefix=prefix)
    store._client = base.client
    return store


@pytest.mark.parametrize("prefix", ["{test}:", "test{", "te}st:"])
def test_a_prefix_with_a_brace_is_e004(prefix):
    for config in ({"CACHE": "default"}, {"CLUSTER": "redis://127.0.0.1:7000"}):
        errors = RedisStore.check_config("redis", {**config, "PREFIX": prefix})
        assert [e.id for e in errors] == ["jobguard.E004"]
        assert "must not contain '{' or '}'" in errors[0].msg and repr(prefix) in errors[0].msg


@requires_redis_server
def test_windows_grouped_by_the_slot_of_the_key_as_stored(redis_cluster):
    """Two windows in one slot without the prefix but in two with it: one script each."""
    by_slot: dict[int, str] = {}
    for i in range(20_000):
        key = f"jobguard:rate:pair-{i}:60s"
        other = by_slot.setdefault(key_slot(key), key)
        if other != key and key_slot(PREFIX + key) != key_slot(PREFIX + other):
            break
    else:
        raise AssertionError("no such pair among 20,000 keys")
    store = RedisStore(alias="c", cluster=redis_cluster.url, prefix=PREFIX)
    try:
        decision = store.hit_rate_limits([RateWindow(key, 1, 60), RateWindow(other, 1, 60)])
        assert decision.allowed
        assert {info.key: info.hits for info in store.throttles("jobguard:rate:pair-")} == {
            key: 1, other: 1}
    finally:
        store.delete_keys([PREFIX + key, PREFIX + other])
