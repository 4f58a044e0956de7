"""A counting call whose connection is cut after the store applied it, and that the client
sends again: counted too much at worst, never too little.

Redis: redis-py retries a command whose connection failed (a ``RedisCluster`` 10 times by
default; a django-redis pool when a ``Retry`` is configured in ``CONNECTION_POOL_KWARGS``). A
reply lost after the server ran the script makes the retry run it again. A rate hit or a
circuit's failure then counts twice (an over-count: a later start waits a slot longer); a
hit *given back* (a Cluster's limit over several slots, one of which refused) is given back
once, since twice would give back a hit nobody gave back and let a job past its limit. The
cut here is made after the reply was read, so the server did apply the first run. The
database store does not try a transaction again when its commit failed (it may have been
applied): the same cut there counts once and the call raises ``StoreUnavailableError`` (the
job is put back, the hit it made stays counted).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import InterfaceError, connections

from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.stores import get_store
from django_jobguard.stores.base import RateWindow
from tests.support import requires_redis

pytestmark = pytest.mark.django_db

WINDOW = [RateWindow("jobguard:rate:retried", 10, 60)]


def hit(store):
    return store.hit_rate_limits(WINDOW)


def fail(store):
    return store.circuit_leave("jobguard:circuit:retried", owner="me", outcome="failure",
                               max_attempts=10, decay=60)


def counted(store, key: str) -> int:
    [info] = [t for t in store.throttles() if t.key == key]
    return info.hits


@pytest.fixture
def retrying() -> Iterator:
    """A Redis store on this session's Redis whose connections retry a failed command once
    (as a ``RedisCluster``'s do by default): its own client, since django-redis shares one
    pool among the caches of one URL."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from django_jobguard.stores.redis import RedisStore

    store = RedisStore(alias="retrying", prefix="retried:")
    store._client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"],
                                         retry=Retry(NoBackoff(), 1))
    yield store
    for key in store.client.scan_iter(match="retried:*", count=1000):
        store.client.delete(key)
    store.client.close()


def cut_reply(monkeypatch, number: int) -> list:
    """Cut the connection after the ``number``-th reply from now was read (the server ran
    the command): redis-py's retry sends it again. Returns the list of replies cut."""
    from redis.connection import AbstractConnection
    from redis.exceptions import ConnectionError

    real, reads, cuts = AbstractConnection.read_response, [], []

    def read_response(self, *args, **kwargs):
        reply = real(self, *args, **kwargs)
        reads.append(reply)
        if len(reads) == number and not cuts:
            cuts.append(reply)
            raise ConnectionError("Connection closed by server.")
        return reply

    monkeypatch.setattr(AbstractConnection, "read_response", read_response)
    return cuts


@requires_redis
@pytest.mark.parametrize("call, key", [(hit, "jobguard:rate:retried"),
                                       (fail, "jobguard:circuit:retried")])
def test_a_redis_count_retried_after_a_cut_counts_too_much_not_too_little(
        retrying, monkeypatch, call, key):
    call(retrying)  # (the script is loaded: the next reply read is the counting one's)
    cuts = cut_reply(monkeypatch, 1)
    call(retrying)  # answered by redis-py's retry, as if nothing happened
    monkeypatch.undo()
    assert cuts and counted(retrying, key) == 3  # two calls, the cut one run twice


@requires_redis
def test_a_hit_given_back_and_retried_after_a_cut_is_given_back_once(retrying, monkeypatch):
    """A Cluster's limit over two hash slots: the first slot's window is hit, the second's
    refuses, so the first's hit is given back; that give-back is cut and retried. Before it,
    the first window held one hit of its own: it must still hold it (given back twice, it
    held none, and a job could pass a full window). One Redis here, grouped as a Cluster."""
    from django_jobguard.stores.redis import key_slot

    names = [f"jobguard:rate:undo-{n}" for n in range(40)]
    first, second = next((a, b) for a in names for b in names
                         if key_slot("retried:" + a) < key_slot("retried:" + b))
    roomy, full = RateWindow(first, 10, 60), RateWindow(second, 1, 60)
    retrying.hit_rate_limits([roomy])
    retrying.hit_rate_limits([full])
    retrying.is_cluster = True  # one script per slot, as on a Cluster
    try:
        assert not retrying.hit_rate_limits([roomy, full]).allowed  # loads the scripts
        cuts = cut_reply(monkeypatch, 3)  # the hit, the refusal, then the give-back's reply
        assert not retrying.hit_rate_limits([roomy, full]).allowed
        monkeypatch.undo()
    finally:
        retrying.is_cluster = False
    assert cuts and counted(retrying, first) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("call, key", [(hit, "jobguard:rate:retried"),
                                       (fail, "jobguard:circuit:retried")])
def test_a_database_count_whose_commit_was_cut_is_not_tried_again(monkeypatch, call, key):
    """The connection cut as the count's transaction committed: the commit may have been
    applied, so the store does not try the transaction again (counted once; a review's
    finding, formerly in test_database_outage)."""
    store = get_store("database")
    call(store)
    wrapper = type(connections["default"])
    real_commit, usable, cuts, checked = wrapper.commit, wrapper.is_usable, [], []

    def commit(self):
        real_commit(self)  # applied, then the connection goes
        if not cuts:
            cuts.append(True)
            raise InterfaceError("connection already closed")

    def is_usable(self):  # as after a real cut: Django's check fails once, then reconnects
        if cuts and not checked:
            checked.append(True)
            return False
        return usable(self)

    monkeypatch.setattr(wrapper, "commit", commit)
    monkeypatch.setattr(wrapper, "is_usable", is_usable)
    with pytest.raises(StoreUnavailableError):
        call(store)
    monkeypatch.undo()
    assert cuts and counted(store, key) == 2  # the first call's and the cut one's, once


@requires_redis
def test_a_lock_taken_and_retried_after_a_cut_is_the_callers(retrying, monkeypatch):
    """The acquire ran (the lock is taken) and its answer was cut: redis-py's retry must get
    the lock it took, not "held by someone else" (the caller's own lock then stayed held
    until its TTL, for ever without one). Locks stay not re-entrant: another acquire by the
    same owner still fails."""
    key = "jobguard:lock:retried"
    assert retrying.acquire("jobguard:lock:warm", "w") is not None  # (the script is loaded)
    cuts = cut_reply(monkeypatch, 1)
    token = retrying.acquire(key, "me")
    monkeypatch.undo()
    assert cuts and token is not None and token == retrying.get_lock(key).token
    assert retrying.acquire(key, "me") is None
    assert retrying.release(key, "me")


@requires_redis
@pytest.mark.parametrize("store_alias", ["redis"], indirect=True)
def test_an_overlap_lock_taken_whose_answer_was_lost_is_freed(store_alias, monkeypatch):
    """No retry (django-redis's default pool): the acquire took the lock, its answer was cut,
    so WithoutOverlapping raises the outage. The lock it took has an owner nobody else knows:
    it is released there, not left held until its expiry (for good without one)."""
    from django_jobguard import WithoutOverlapping
    from django_jobguard.context import JobContext
    from tests.support.lock_jobs import Overlap

    store = get_store(store_alias)
    job = Overlap("cut")
    job.context = JobContext(job_id="cut-job")
    guard = WithoutOverlapping("cut")
    store.acquire("jobguard:lock:warm", "w")  # (the script is loaded)
    cuts = cut_reply(monkeypatch, 1)
    with pytest.raises(StoreUnavailableError):
        guard.enter(job)
    monkeypatch.undo()
    assert cuts and store.get_lock(guard.lock_key(job)) is None


@requires_redis
def test_an_acquire_of_a_key_holding_something_else_is_refused_not_an_error(retrying):
    """A key that holds a value other than a lock (a string under the store's prefix) reads
    as held, as before the acquire named its call: no WRONGTYPE error from reading it."""
    retrying.client.set("retried:jobguard:lock:string", "x")
    assert retrying.acquire("jobguard:lock:string", "me") is None
