"""Tests that use the Redis store leave it as they found it (issue 30 item 1): what the test's
process wrote (rate windows stamped by the test clock, circuits, locks) is deleted when the
test, or the clock block, ends; and ``STORES[...]["PREFIX"]`` keeps a test run's keys apart
from the project's workers on the same server."""

from __future__ import annotations

import textwrap

import pytest

from django_jobguard.stores.base import RateWindow
from django_jobguard.stores.journal import recording
from django_jobguard.stores.redis import RedisStore, fence_key
from django_jobguard.testing import clock
from tests.support import requires_redis
from tests.support.throwaway import SETTINGS, run_project

pytest_plugins = ["pytester"]

pytestmark = requires_redis

REDIS_SETTINGS = SETTINGS + textwrap.dedent("""
    import os
    CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                          "LOCATION": os.environ["JOBGUARD_REDIS_URL"]}}
    JOBGUARD = {"STORE": "redis", "STORES": {"redis": {
        "BACKEND": "django_jobguard.stores.redis.RedisStore", "CACHE": "default",
        "PREFIX": "test:"}}}
""")

JOBS = """
from django_jobguard import Job, Limit, RateLimited, rate_limiter

rate_limiter.define("customer-notify", Limit.per_minute(10))


class Notify(Job):
    def __init__(self, customer):
        self.customer = customer

    def middleware(self):
        return [RateLimited("customer-notify")]

    def handle(self):
        pass
"""

# What a user writes: the 11th call in a minute waits, once with the clock moved on (the window
# is stamped two minutes ahead of the real now) and once without a clock. Each runs twice in
# the same process (the parameter).
USER_TESTS = """
import pytest
from django_jobguard.testing import clock, drain

from shop.jobs import Notify


@pytest.mark.django_db
@pytest.mark.parametrize("run", [1, 2])
def test_the_eleventh_call_in_a_minute_waits_under_the_clock(run):
    with clock() as c:
        c.advance(minutes=2)
        for n in range(11):
            Notify(n).dispatch()
        result = drain()
        assert (result.done, result.released) == (10, 1)


@pytest.mark.django_db
@pytest.mark.parametrize("run", [1, 2])
def test_the_eleventh_call_in_a_minute_waits(run):
    for n in range(11):
        Notify(n).dispatch()
    result = drain()
    assert (result.done, result.released) == (10, 1)
"""


def _client():
    from django_redis import get_redis_connection

    return get_redis_connection("default")


def _forget(client, pattern: str) -> None:
    for key in client.scan_iter(match=pattern):
        client.delete(key)


def test_a_user_style_test_passes_twice_in_a_row_in_one_process_and_across_processes(
        pytester):
    client = _client()
    _forget(client, "test:jobguard:*")
    # The project's own workers, on the same Redis, have a full window for the same limiter:
    # the test run (prefix "test:") neither sees nor deletes it.
    project = RedisStore(alias="project", cache="default")
    from django_jobguard.stores.base import RateWindow

    window = RateWindow("jobguard:rate:customer-notify:60s", limit=10, decay=60)
    for _ in range(10):
        assert project.hit_rate_limits([window]).allowed
    try:
        files = {"shop/jobs.py": textwrap.dedent(JOBS), "test_notify.py": USER_TESTS,
                 "throwaway_settings.py": REDIS_SETTINGS}
        for _ in range(2):  # two pytest processes, one after the other
            result = run_project(pytester, files)
            result.assert_outcomes(passed=4)
            assert list(client.scan_iter(match="test:jobguard:*")) == []  # nothing left over
        assert not project.hit_rate_limits([window]).allowed  # the project's window is intact
    finally:
        project.delete_keys([window.key])


@pytest.fixture
def redis_store(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "STORE": "redis"}
    from django_jobguard.stores import get_store

    store = get_store("redis")
    _forget(store.client, "jobguard:unit-isolation*")
    return store


def test_leaving_the_clock_deletes_what_was_written_at_a_shifted_now(redis_store):
    from django_jobguard.stores.base import RateWindow

    window = RateWindow("jobguard:unit-isolation:rate", limit=1, decay=60)
    with clock() as c:
        c.advance(minutes=2)
        assert redis_store.hit_rate_limits([window]).allowed
        assert redis_store.acquire("jobguard:unit-isolation:lock", "me", ttl=600)
        assert not redis_store.hit_rate_limits([window]).allowed
    assert redis_store.hit_rate_limits([window]).allowed  # the future window is gone
    assert redis_store.get_lock("jobguard:unit-isolation:lock") is None
    assert redis_store.client.exists("jobguard:unit-isolation:lock") == 0
    assert redis_store.client.exists(fence_key("jobguard:unit-isolation:lock")) == 0


def test_isolated_stores_undoes_a_block_and_leaves_other_keys(redis_store):
    redis_store.client.set("jobguard:unit-isolation:someone-else", "x")
    with recording():
        redis_store.acquire("jobguard:unit-isolation:mine", "me")
        redis_store.circuit_leave("jobguard:unit-isolation:circuit", owner="me",
                                  outcome="failure", max_attempts=3, decay=60)
        assert redis_store.client.exists("jobguard:unit-isolation:circuit") == 1
    assert redis_store.get_lock("jobguard:unit-isolation:mine") is None
    assert redis_store.client.exists("jobguard:unit-isolation:circuit") == 0
    assert redis_store.client.get("jobguard:unit-isolation:someone-else") == b"x"
    redis_store.client.delete("jobguard:unit-isolation:someone-else")


def test_a_prefixed_store_lists_and_releases_its_keys_without_the_prefix(redis_store):
    store = RedisStore(alias="prefixed", cache=redis_store.cache_alias, prefix="unit-run:")
    try:
        assert store.acquire("jobguard:unique:x:1", "me", ttl=60)
        assert redis_store.client.exists("unit-run:jobguard:unique:x:1") == 1
        assert [info.key for info in store.locks()] == ["jobguard:unique:x:1"]
        assert [info.key for info in store.lock_page().locks] == ["jobguard:unique:x:1"]
        assert store.get_lock("jobguard:unique:x:1").owner == "me"
        assert redis_store.get_lock("jobguard:unique:x:1") is None  # unprefixed: not seen
        from django_jobguard.stores.base import RateWindow

        window = RateWindow("jobguard:rate:x:60s", limit=1, decay=60)
        assert store.hit_rate_limits([window]).allowed
        assert store.hit_rate_limits([window]).blocked == ("jobguard:rate:x:60s",)
        assert [t.key for t in store.throttles()] == ["jobguard:rate:x:60s"]
        assert store.reset_throttle("jobguard:rate:x:60s")
        assert store.release("jobguard:unique:x:1", "me")
    finally:
        _forget(redis_store.client, "unit-run:*")


def test_a_prefix_that_is_not_a_string_is_a_check_error():
    errors = RedisStore.check_config("redis", {"CACHE": "default", "PREFIX": 3})
    assert [e.id for e in errors] == ["jobguard.E004"]
    assert "PREFIX'] must be a string, not int" in errors[0].msg



def test_a_lock_someone_else_holds_is_not_undone(redis_store):
    other = RedisStore(alias="other", cache=redis_store.cache_alias)
    assert other.acquire("jobguard:unit-isolation:theirs", "a-worker", ttl=60)
    try:
        with recording():
            assert redis_store.acquire("jobguard:unit-isolation:theirs", "the-test") is None
        assert redis_store.get_lock("jobguard:unit-isolation:theirs").owner == "a-worker"
    finally:
        _forget(other.client, "jobguard:unit-isolation:theirs*")


def test_a_prefix_with_glob_characters_lists_only_its_own_keys(redis_store):
    mine = RedisStore(alias="mine", cache=redis_store.cache_alias, prefix="unit-glob*[x]:")
    other = RedisStore(alias="other", cache=redis_store.cache_alias, prefix="unit-globby-x:")
    try:
        assert other.acquire("jobguard:unique:g:1", "them", ttl=60)
        assert other.hit_rate_limits([RateWindow("jobguard:rate:g:60s", 5, 60)]).allowed
        assert mine.locks() == [] and mine.lock_page().locks == [] and mine.throttles() == []
        assert mine.acquire("jobguard:unique:g:2", "me", ttl=60)
        assert [info.key for info in mine.locks()] == ["jobguard:unique:g:2"]
    finally:
        _forget(redis_store.client, "unit-glob*")
