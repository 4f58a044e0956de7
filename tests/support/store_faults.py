"""Stores that cannot be reached, in-process and without a server to stop.

:func:`statements_fail` makes the statements Django sends fail with the error a cut connection
gives (``OperationalError: server closed the connection unexpectedly``), in every thread, while
its switch is on: every statement, or only those on jobguard's lock and throttle tables (the
database store's), so that the worker's own writes to the queue still go through and a test
can see where a job's row ends. The database store's own code turns the error into
``StoreUnavailableError`` as it would a real one. A connection really cut by the server
(``pg_terminate_backend``) is in tests/unit/stores/test_database_outage.py.

:func:`redis_refusing` adds a Redis store whose server refuses every connection (a port that
is bound but never listens; no Redis server needed, only django-redis), and
:func:`redis_store_at` one on any port (one that accepts and never answers, for timeouts).
:func:`store_down` gives either kind by name, for tests run once per store kind.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.backends.utils import CursorWrapper
from django.test import override_settings

from django_jobguard.conf import jobguard_settings
from django_jobguard.models import Lock, Throttle
from django_jobguard.stores.base import RateWindow

#: The tables of the database store (its statements are the ones naming them).
STORE_TABLES = (Lock._meta.db_table, Throttle._meta.db_table)

CUT = "server closed the connection unexpectedly"


@dataclass
class Switch:
    """``down``: statements fail while it is true; ``failed``: the statements that did."""

    down: bool = False
    failed: list[str] = field(default_factory=list)


@contextmanager
def statements_fail(*, store_only: bool = True, down: bool = True,
                    error: Exception | None = None) -> Iterator[Switch]:
    """While the switch it yields is ``down``, the statements on the store's tables
    (``store_only``) or all statements raise ``error`` (a cut connection's
    ``OperationalError`` by default), in every thread; for a cut connection's error Django's
    ``is_usable()`` says False too, as after a real cut."""
    switch = Switch(down=down)
    original = CursorWrapper.execute

    def execute(self, sql, params=None):
        if switch.down and (not store_only or any(table in sql for table in STORE_TABLES)):
            switch.failed.append(sql)
            raise error or OperationalError(CUT)
        return original(self, sql, params)

    # A cut connection (the default error, or one that says so) fails Django's check too.
    cut = error is None or isinstance(error, InterfaceError) or CUT in str(error)

    def is_usable(self):
        return not (switch.down and cut) and checks[type(self)](self)

    CursorWrapper.execute = execute
    wrappers = {type(connection) for connection in connections.all()}  # (each has its own)
    checks = {cls: cls.is_usable for cls in wrappers}
    for cls in wrappers:
        cls.is_usable = is_usable
    try:
        yield switch
    finally:
        CursorWrapper.execute = original
        for cls, check in checks.items():
            cls.is_usable = check


def redis_store_at(port: int, alias: str = "down", **options) -> override_settings:
    """Settings in which store ``alias`` is a Redis store on 127.0.0.1:``port`` (a cache of
    the same name with the django-redis ``OPTIONS`` given)."""
    caches = {**settings.CACHES, alias: {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://127.0.0.1:{port}/0",
        "OPTIONS": options}}
    user = jobguard_settings.user_settings
    stores = {**user.get("STORES", {}),
              alias: {"BACKEND": "django_jobguard.stores.redis.RedisStore", "CACHE": alias}}
    return override_settings(CACHES=caches, JOBGUARD={**user, "STORES": stores})


@contextmanager
def redis_refusing(alias: str = "down") -> Iterator[str]:
    """Store ``alias``: Redis on a port that is bound but never listens (connection refused:
    every call raises ``StoreUnavailableError``); yields the alias."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with redis_store_at(sock.getsockname()[1], alias):
            yield alias


@contextmanager
def store_down(kind: str) -> Iterator[str]:
    """A store of ``kind`` (``database``, ``redis``) that cannot be reached; yields its alias
    (``database``: its statements fail; ``redis``: :func:`redis_refusing`, skipped without
    django-redis)."""
    if kind == "database":
        with statements_fail() as switch:
            yield "database"
        assert switch.failed, "the database store was never asked"
        return
    import pytest

    pytest.importorskip("django_redis")
    with redis_refusing("down") as alias:
        yield alias


#: One call of each store primitive, by name (the outage tests call each on a store that is
#: down, then on one that is back).
PRIMITIVES = {
    "acquire": lambda s: s.acquire("jobguard:k", "me", ttl=5),
    "release": lambda s: s.release("jobguard:k", "me"),
    "extend": lambda s: s.extend("jobguard:k", "me", ttl=5),
    "force_release": lambda s: s.force_release("jobguard:k"),
    "get_lock": lambda s: s.get_lock("jobguard:k"),
    "locks": lambda s: s.locks(),
    "now": lambda s: s.now(),
    "hit_rate_limits": lambda s: s.hit_rate_limits([RateWindow("jobguard:r", 5, 60)]),
    "circuit_enter": lambda s: s.circuit_enter("jobguard:c", owner="me", max_attempts=3,
                                               decay=60, probe_lease=60),
    "circuit_leave": lambda s: s.circuit_leave("jobguard:c", owner="me", outcome="failure",
                                               max_attempts=3, decay=60),
    "throttles": lambda s: s.throttles(),
    "reset_throttle": lambda s: s.reset_throttle("jobguard:c"),
}


def terminate_backend(connection) -> None:
    """Cut ``connection``'s PostgreSQL backend from another connection, as a server restart
    does (the next statement on it fails; Django does not know yet)."""
    from django.db import connections

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    killer = connections.create_connection(connection.alias)
    try:
        with killer.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        killer.close()
