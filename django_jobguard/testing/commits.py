"""Run the ``on_commit`` callbacks a test's transaction holds back.

In a ``TestCase`` (and pytest-django's ``db`` fixture) every test runs inside a transaction
that is rolled back, so ``dispatch(on_commit=True)`` would never insert its row. Once the
code under test has left its own ``atomic()`` blocks, its callbacks would have run in
production: :func:`run_on_commit_callbacks` runs them then, as
``TestCase.captureOnCommitCallbacks(execute=True)`` does on exit (callbacks that register more
callbacks included).
"""

from __future__ import annotations

import logging

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_jobguard.testing")


def _only_test_atomics(connection: BaseDatabaseWrapper) -> bool:
    """True when every open atomic block is a test case's (none is the code's own)."""
    return connection.in_atomic_block and all(
        getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def run_on_commit_callbacks(using: str | None = None) -> int:
    """Run and forget the callbacks waiting for a test case's transaction to commit, on
    ``using`` (all initialised connections by default); returns how many ran.

    Nothing runs while the code under test is still inside its own ``atomic()`` block: its
    callbacks wait for it to end, as they would in production.
    """
    aliases = [using] if using else [c.alias for c in connections.all(initialized_only=True)]
    ran = 0
    for alias in aliases:
        connection = connections[alias]
        while _only_test_atomics(connection) and connection.run_on_commit:
            # (savepoint ids, callback, robust): django-stubs still has the two-item form.
            _, func, robust = connection.run_on_commit.pop(0)  # type: ignore[misc]
            ran += 1
            if robust:
                try:
                    func()
                except Exception as exc:
                    logger.exception("Error calling %s in on_commit() (%s).", func, exc)
            else:
                func()
    return ran
