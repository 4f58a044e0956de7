"""The lock stores, each test on the database store and on Redis: ownership, expiry on the
store's clock, fencing tokens, listing, cleaning, bad input."""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django.utils import timezone

from django_jobguard.models import Lock
from django_jobguard.stores import get_store
from django_jobguard.stores.database import DatabaseStore
from tests.support import expire, wait_for

pytestmark = pytest.mark.django_db

KEY = "jobguard:overlap:tests:k"


@pytest.fixture
def store(store_alias):
    return get_store(store_alias)


def test_acquire_is_exclusive_and_release_is_owner_checked(store):
    token = store.acquire(KEY, "a", job_id="job-a")
    assert isinstance(token, int) and token > 0
    assert store.acquire(KEY, "b") is None
    assert store.acquire(KEY, "a") is None  # not re-entrant
    assert not store.release(KEY, "b")
    info = store.get_lock(KEY)
    assert (info.owner, info.token, info.job_id, info.kind) == ("a", token, "job-a", "overlap")
    assert info.expires_at is None and info.store == store.alias
    assert store.release(KEY, "a")
    assert store.get_lock(KEY) is None
    assert not store.release(KEY, "a")  # twice: nothing left to release
    assert store.acquire(KEY, "b") > token


def test_expiry_uses_the_store_clock(store):
    store.acquire(KEY, "a", ttl=30)
    info = store.get_lock(KEY)
    now = store.now()
    assert now.tzinfo is not None
    assert datetime.timedelta(seconds=28) < info.expires_at - now <= datetime.timedelta(seconds=30)
    assert store.acquire(KEY, "b", ttl=30) is None
    expire(store, KEY)
    assert store.acquire(KEY, "b", ttl=30) is not None
    assert store.get_lock(KEY).owner == "b"


def test_a_short_ttl_really_expires(store):
    # 0.4 ms used to round down to "no expiry" on Redis.
    assert store.acquire(KEY, "a", ttl=0.0004)
    wait_for(lambda: store.acquire(KEY, "b") is not None, timeout=5, interval=0.01)
    assert store.get_lock(KEY).owner == "b"


def test_stale_owner_cannot_release_or_extend_the_new_owners_lock(store):
    old = store.acquire(KEY, "old", ttl=30)
    expire(store, KEY)
    new = store.acquire(KEY, "new", ttl=30)
    assert new > old
    assert not store.release(KEY, "old")
    assert not store.extend(KEY, "old", ttl=60)
    info = store.get_lock(KEY)
    assert (info.owner, info.token) == ("new", new)


def test_extend_renews_only_a_held_lock(store):
    store.acquire(KEY, "a", ttl=5)
    assert store.extend(KEY, "a", ttl=120)
    remaining = store.get_lock(KEY).expires_at - store.now()
    assert remaining > datetime.timedelta(seconds=100)
    assert not store.extend(KEY, "b", ttl=120)
    assert store.extend(KEY, "a", ttl=0)  # 0 = never expires
    assert store.get_lock(KEY).expires_at is None
    store.extend(KEY, "a", ttl=5)
    expire(store, KEY)
    assert not store.extend(KEY, "a", ttl=60)  # too late: it expired (Laravel's refresh too)


def test_fencing_tokens_strictly_increase_through_every_path(store):
    tokens = [store.acquire(KEY, "a", ttl=30)]
    store.release(KEY, "a")
    tokens.append(store.acquire(KEY, "b"))
    store.force_release(KEY)
    tokens.append(store.acquire(KEY, "c", ttl=30))
    expire(store, KEY)
    tokens.append(store.acquire(KEY, "d", ttl=30))
    expire(store, KEY)
    store.clean_expired()
    tokens.append(store.acquire(KEY, "e"))
    store.release(KEY, "e")
    if isinstance(store, DatabaseStore):  # a row free for an hour is deleted: the clock floor
        Lock.objects.filter(key=KEY).update(acquired_at=timezone.now() - datetime.timedelta(
            hours=2))
        store.clean_expired()
        assert not Lock.objects.filter(key=KEY).exists()
        wait_for(lambda: store.now() > datetime.datetime.fromtimestamp(
            tokens[-1] / 1e6, tz=datetime.UTC), timeout=5, interval=0.001)
        tokens.append(store.acquire(KEY, "f"))
        store.release(KEY, "f")
    for n in range(20):
        tokens.append(store.acquire(KEY, f"loop-{n}"))
        store.release(KEY, f"loop-{n}")
    assert all(b > a for a, b in zip(tokens, tokens[1:], strict=False)), tokens
    other = store.acquire("jobguard:overlap:tests:other", "a")
    assert other is not None  # tokens are per key, but never small: they start at the clock


def test_force_release_frees_whoever_holds_it(store):
    store.acquire(KEY, "a")
    assert store.force_release(KEY)
    assert store.get_lock(KEY) is None
    assert not store.force_release(KEY)


def test_locks_lists_by_prefix(store):
    store.acquire("jobguard:unique:tests.A:1", "a", job_id="j1")
    store.acquire("jobguard:overlap:tests.B:2", "b", ttl=60)
    store.acquire("other:thing", "c")
    listed = store.locks()
    assert [(i.key, i.kind) for i in listed] == [("jobguard:overlap:tests.B:2", "overlap"),
                                                 ("jobguard:unique:tests.A:1", "unique")]
    assert [i.key for i in store.locks("jobguard:unique:")] == ["jobguard:unique:tests.A:1"]
    store.release("jobguard:unique:tests.A:1", "a")
    assert [i.key for i in store.locks()] == ["jobguard:overlap:tests.B:2"]
    store.force_release("other:thing")


def test_expired_locks_are_listed_on_request_and_cleaned(store):
    store.acquire("jobguard:overlap:x:1", "a", ttl=30)
    store.acquire("jobguard:overlap:x:2", "b")
    expire(store, "jobguard:overlap:x:1")
    assert [i.key for i in store.locks()] == ["jobguard:overlap:x:2"]
    if isinstance(store, DatabaseStore):  # Redis forgets expired keys by itself
        assert [i.key for i in store.locks(include_expired=True)] == ["jobguard:overlap:x:1",
                                                                      "jobguard:overlap:x:2"]
        assert store.clean_expired() == 1
        assert Lock.objects.get(key="jobguard:overlap:x:1").owner == ""  # kept for its token
    assert [i.key for i in store.locks(include_expired=True)] == ["jobguard:overlap:x:2"]


@pytest.mark.parametrize("key, owner, ttl, message", [
    ("", "a", None, "non-empty string"),
    ("jobguard:" + "x" * 250, "a", None, "over the limit of 255"),
    (KEY, "", None, "owner must be a non-empty string"),
    (KEY, "o" * 101, None, "over 100"),
    (KEY, "a", -1, "ttl must be seconds >= 0"),
    (KEY, "a", "10", "ttl must be seconds >= 0"),
])
def test_bad_input_is_rejected_with_the_reason(store, key, owner, ttl, message):
    with pytest.raises(ValueError, match=message):
        store.acquire(key, owner, ttl=ttl)


def test_database_acquire_is_one_statement(store_alias):
    if store_alias != "database":
        pytest.skip("database store only")
    if connection.vendor not in ("postgresql", "sqlite"):
        pytest.skip("the ORM path (MariaDB) takes a lock with an UPDATE, then an INSERT under a "
                    "savepoint, in one transaction")
    from django.test.utils import CaptureQueriesContext

    store = get_store("database")
    with CaptureQueriesContext(connection) as queries:
        store.acquire(KEY, "a", ttl=10)
        store.acquire(KEY, "b", ttl=10)
    assert len(queries) == 2


def _hold_many(store, count: int) -> set[str]:
    held = set()
    for i in range(count):
        key = f"jobguard:{'unique' if i % 3 else 'overlap'}:tests.Page:{i:04d}"
        assert store.acquire(key, f"o{i}", ttl=300)
        held.add(key)
    return held


def test_lock_pages_walk_every_lock_once_by_cursor(store):
    held = _hold_many(store, 250)
    store.acquire("other:not-listed", "x")  # outside jobguard: never listed
    seen, cursor, pages = [], "", 0
    while True:
        page = store.lock_page(cursor=cursor, limit=100)
        # A page with a next cursor holds at least ``limit`` locks. Only on Redis may the last
        # page be empty: SCAN can end a page at 100 locks while keys remain to look at, and
        # the next call finds none of them to be locks.
        assert len(page.locks) >= 100 if page.cursor else (
            page.locks or store.alias.startswith("redis"))
        assert [i.key for i in page.locks] == sorted(i.key for i in page.locks)  # key order
        seen += [info.key for info in page.locks]
        pages += 1
        if not page.cursor:
            break
        cursor = page.cursor
    assert set(seen) == held and pages >= 2
    if store.alias == "database":  # a keyset: exact pages, each lock once
        assert len(seen) == 250 and pages == 3


def test_a_lock_page_is_narrowed_by_prefix(store):
    held = _hold_many(store, 30)
    page = store.lock_page("jobguard:overlap:", limit=100)
    assert {i.key for i in page.locks} == {k for k in held if ":overlap:" in k}
    assert page.cursor == ""


def test_a_database_lock_page_is_one_query_however_many_locks(store):
    if store.alias != "database":
        pytest.skip("database store only")
    from django.test.utils import CaptureQueriesContext

    _hold_many(store, 150)
    with CaptureQueriesContext(connection) as captured:
        page = store.lock_page(limit=50)
    assert len(page.locks) == 50 and len(captured) == 1
    assert "LIMIT 51" in captured[0]["sql"]


def test_a_redis_cursor_must_be_a_number(store):
    if not store.alias.startswith("redis"):
        pytest.skip("Redis store only")
    with pytest.raises(ValueError, match="not a cursor of the Redis store"):
        store.lock_page(cursor="jobguard:unique:x")


def test_a_redis_lock_hash_without_acquired_at_is_read(store):
    # A hash written by hand or by an older jobguard has no acquired_at: it is listed with
    # acquired_at None instead of raising TypeError (stores/redis.py had a second _from_us that
    # did not take None and silently replaced the first).
    if not store.alias.startswith("redis"):
        pytest.skip("Redis store only")
    store.client.hset(KEY, mapping={"owner": "a", "token": "7", "job_id": "job-a"})
    info = store.get_lock(KEY)
    assert (info.owner, info.token, info.job_id, info.acquired_at) == ("a", 7, "job-a", None)
    assert [lock.acquired_at for lock in store.locks()] == [None]
    assert store.release(KEY, "a")
