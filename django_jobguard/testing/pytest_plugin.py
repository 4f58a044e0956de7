"""The pytest plugin (entry point ``pytest11``): jobguard's fixtures, with no conftest.

- ``jobguard_capture``: a :class:`~django_jobguard.testing.Capture` active for the test.
- ``jobguard_drain``: :func:`~django_jobguard.testing.drain`, to call when the test wants.
- ``jobguard_inline``: inline mode (each dispatch runs at once) for the test.
- ``jobguard_clock``: a running test clock (``jobguard_clock.advance(minutes=5)``).

They need the database like any other test (``@pytest.mark.django_db`` or the ``db`` fixture).

Every test also undoes, when it ends, what its process wrote to jobguard's Redis stores (locks,
rate windows, circuits): Redis is not rolled back with the test's transaction (see
:mod:`django_jobguard.stores.journal`). Django's settings are not read until a fixture is used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _jobguard_undo_store_writes() -> Iterator[None]:
    """Delete the Redis keys (locks, windows, circuits) this process wrote during the test."""
    from django_jobguard.stores.journal import recording

    with recording():
        yield


@pytest.fixture(autouse=True)
def _jobguard_close_result_connections() -> Iterator[None]:
    """Close the connections ``handle.wait()`` keeps for the next wait on PostgreSQL, and the
    workers' claim connections, when the test ends: an open session would keep the test
    database from being dropped."""
    yield
    postgresql = sys.modules.get("django_jobguard.dialects.postgresql")
    if postgresql is not None:
        postgresql.close_idle_result_connections()
        postgresql.close_claim_connections(every_thread=True)


def _needs_pytest_django(request: pytest.FixtureRequest) -> None:
    """Fail the test with what to install when pytest-django is not there (it sets Django up
    and gives tests the database the fixtures use)."""
    if not request.config.pluginmanager.hasplugin("django"):
        pytest.fail("jobguard's pytest fixtures need pytest-django: pip install pytest-django, "
                    "and set DJANGO_SETTINGS_MODULE (or pass --ds).", pytrace=False)


@pytest.fixture
def jobguard_capture(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Record the jobs the test dispatches (``jobguard_capture.assert_dispatched(...)``)."""
    _needs_pytest_django(request)
    from django_jobguard.testing.recording import capture

    with capture() as jobs:
        yield jobs


@pytest.fixture
def jobguard_drain(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``jobguard_drain(queue=None, recursive=True, delayed=False)`` runs the queued jobs."""
    _needs_pytest_django(request)
    from django_jobguard.testing.draining import drain

    return drain


@pytest.fixture
def jobguard_inline(request: pytest.FixtureRequest) -> Iterator[None]:
    """Run every job the test dispatches at once (``JOBGUARD["TEST_MODE"] = "inline"``)."""
    _needs_pytest_django(request)
    from django_jobguard.testing.inline_mode import inline

    with inline():
        yield


@pytest.fixture
def jobguard_clock(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A running test clock: ``jobguard_clock.advance(minutes=5)`` moves jobguard's now."""
    _needs_pytest_django(request)
    from django_jobguard.testing.time_travel import clock

    with clock() as test_clock:
        yield test_clock
