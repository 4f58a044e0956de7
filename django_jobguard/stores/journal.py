"""What a test wrote to the Redis stores, so that the testing API can undo it.

Redis is not rolled back with a test's transaction, and tests often share the project's Redis:
a rate window, circuit or lock a test left behind (with a start the test clock moved into the
future, say) would change what the next run sees. While a scope is open (:func:`recording`:
every test under the pytest plugin, each :func:`~django_jobguard.testing.clock` block,
:func:`~django_jobguard.testing.isolated_stores`) the Redis store notes each key it writes, and
closing the scope deletes them. Production never opens a scope: a store's cost is one check of
an empty list.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("django_jobguard.testing")

#: The open scopes, innermost last: each maps a store's id to (the store, the keys it wrote).
scopes: list[dict[int, tuple[Any, set[str]]]] = []


def note(store: Any, *stored: str) -> None:
    """Remember that ``store`` wrote the keys ``stored`` (as stored, with its prefix)."""
    for scope in scopes:
        scope.setdefault(id(store), (store, set()))[1].update(stored)


@contextmanager
def recording() -> Iterator[None]:
    """Note the keys the stores write inside the block, and delete them when it ends."""
    scope: dict[int, tuple[Any, set[str]]] = {}
    scopes.append(scope)
    try:
        yield
    finally:
        scopes.remove(scope)
        undo(scope)


def undo(scope: dict[int, tuple[Any, set[str]]]) -> None:
    """Delete what ``scope`` noted; a store that cannot be reached (a test stopped it) is
    skipped with a warning."""
    from django_jobguard.exceptions import StoreUnavailableError

    for store, stored in scope.values():
        try:
            store.delete_keys(sorted(stored))
        except StoreUnavailableError as exc:
            logger.warning("Could not undo the test's writes to store %r: %s", store.alias, exc)


def isolated_stores() -> Any:
    """A context manager deleting, when it ends, the Redis keys written inside it (locks,
    rate windows, circuits): for ``unittest`` tests (``self.enterContext(isolated_stores())``)
    and code outside pytest; the pytest plugin does it for every test."""
    return recording()
