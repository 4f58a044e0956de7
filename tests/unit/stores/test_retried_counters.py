"""A counting call whose connection is cut after the store applied it, and that the client
sends again, counts once.

Redis: redis-py retries a command whose connection failed (a ``RedisCluster`` 10 times by
default; a django-redis pool when a ``Retry`` is configured in ``CONNECTION_POOL_KWARGS``). A
reply lost after the server ran the script made the retry run it again: a rate hit, or a
circuit's failure, counted twice. The cut here is made after the reply was read, so the
server did apply the first run. The database store does not try a transaction again when its
commit failed (it may have been applied): the same cut there counts once and the call raises
``StoreUnavailableError`` (the job is put back, the hit it made stays counted).
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


@requires_redis
@pytest.mark.parametrize("call, key", [(hit, "jobguard:rate:retried"),
                                       (fail, "jobguard:circuit:retried")])
def test_a_redis_count_retried_after_a_cut_counts_once(retrying, monkeypatch, call, key):
    from redis.connection import AbstractConnection
    from redis.exceptions import ConnectionError

    call(retrying)  # (the script is loaded: the next reply read is the counting one's)
    real, cuts = AbstractConnection.read_response, []

    def read_response(self, *args, **kwargs):
        reply = real(self, *args, **kwargs)  # the server ran it, then the connection goes
        if not cuts:
            cuts.append(reply)
            raise ConnectionError("Connection closed by server.")
        return reply

    monkeypatch.setattr(AbstractConnection, "read_response", read_response)
    call(retrying)  # answered by redis-py's retry, as if nothing happened
    monkeypatch.undo()
    assert cuts and counted(retrying, key) == 2  # before: 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("call, key", [(hit, "jobguard:rate:retried"),
                                       (fail, "jobguard:circuit:retried")])
def test_a_database_count_whose_commit_was_cut_is_not_tried_again(monkeypatch, call, key):
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
