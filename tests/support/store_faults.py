"""A database store whose database cannot be reached, in-process and without a server to stop.

:func:`statements_fail` makes the statements Django sends fail with the error a cut connection
gives (``OperationalError: server closed the connection unexpectedly``), in every thread, while
its switch is on: every statement, or only those on jobguard's lock and throttle tables (the
database store's), so that the worker's own writes to the queue still go through and a test
can see where a job's row ends. The database store's own code turns the error into
``StoreUnavailableError`` as it would a real one. A connection really cut by the server
(``pg_terminate_backend``) is in tests/unit/stores/test_database_outage.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import OperationalError
from django.db.backends.utils import CursorWrapper

from django_jobguard.models import Lock, Throttle

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
    ``OperationalError`` by default), in every thread."""
    switch = Switch(down=down)
    original = CursorWrapper.execute

    def execute(self, sql, params=None):
        if switch.down and (not store_only or any(table in sql for table in STORE_TABLES)):
            switch.failed.append(sql)
            raise error or OperationalError(CUT)
        return original(self, sql, params)

    CursorWrapper.execute = execute
    try:
        yield switch
    finally:
        CursorWrapper.execute = original
