"""The REST API while a lock/throttle store cannot be reached: a 503 ``store_unavailable``
naming the store, with ``Retry-After`` (before, none: a client had no hint when to come
back), and one warning line in the log. Before, ``StoreUnavailableError`` left the
views unhandled: a 500 with a traceback logged at ERROR.

Each store kind is taken down as the store tests do (tests/support/store_faults.py): the
database store's statements fail as on a cut connection; the Redis store is on a port where
nothing listens (no Redis server needed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_jobguard.api.base import STORE_RETRY_AFTER
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import QueuedJob
from tests.support.operate import API, DISPATCHABLE, user_with
from tests.support.store_faults import store_down

pytestmark = pytest.mark.django_db

KEY = "jobguard:overlap:billing.jobs.Charge:7"

#: Every endpoint that reads or changes a store's locks or throttles.
STORE_ENDPOINTS = [
    ("get", "locks/"), ("get", f"locks/{KEY}/"), ("delete", f"locks/{KEY}/"),
    ("get", "throttles/"), ("get", f"throttles/{KEY}/"), ("delete", f"throttles/{KEY}/"),
]


@pytest.fixture(params=["database", "redis"])
def down(request) -> Iterator[str]:
    """The alias of a store that cannot be reached, once per store kind."""
    with store_down(request.param) as alias:
        yield alias


@pytest.fixture
def ops() -> APIClient:
    """A staff user with the lock and throttle permissions (not a superuser)."""
    client = APIClient()
    client.force_authenticate(user_with("ops", "view_lock", "change_lock", "view_throttle",
                                        "change_throttle", "add_queuedjob"))
    return client


def assert_outage(response, alias: str, caplog) -> None:
    assert response.status_code == 503, response.content
    assert response.json() == {"detail": f"Store {alias!r} cannot be reached; try again later.",
                               "code": "store_unavailable"}
    assert response["Retry-After"] == str(STORE_RETRY_AFTER) == "5"
    lines = [(r.name, r.levelno, r.getMessage(), r.exc_info) for r in caplog.records
             if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines  # no ERROR from django.request, no traceback
    name, level, message, exc_info = lines[0]
    assert (name, level, exc_info) == ("django_jobguard.api", logging.WARNING, None)
    assert message.startswith(f"{response.request['REQUEST_METHOD']} "
                              f"{response.request['PATH_INFO']} answered 503: store "
                              f"{alias!r} is unavailable: ")
    assert "\n" not in message


@pytest.mark.parametrize(("method", "path"), STORE_ENDPOINTS)
def test_a_store_that_cannot_be_reached_is_a_503_naming_it(ops, down, caplog, method,
                                                           path):
    with caplog.at_level(logging.INFO):
        response = getattr(ops, method)(f"{API}{path}?store={down}")
    assert_outage(response, down, caplog)


def test_a_unique_dispatch_whose_lock_store_cannot_be_reached_is_a_503(ops, down,
                                                                       caplog):
    settings = {**jobguard_settings.user_settings, "STORE": down,
                "API_DISPATCHABLE_JOBS": DISPATCHABLE}
    with override_settings(JOBGUARD=settings), caplog.at_level(logging.INFO):
        response = ops.post(API + "dispatch/", {"job": "tests.operate.UniqueReport",
                                                "args": [1]}, format="json")
    assert_outage(response, down, caplog)
    assert not QueuedJob.objects.exists()


def test_the_schema_documents_the_503():
    pytest.importorskip("drf_spectacular")
    client = APIClient()
    client.force_authenticate(user_with("reader", "view_queuedjob"))
    paths = client.get(API + "schema/").json()["paths"]
    for method, path in [*STORE_ENDPOINTS, ("post", "dispatch/"),
                         ("post", "schedules/{name}/run/")]:
        path = path.replace(KEY, "{key}")
        operation = paths[f"/jobguard/api/{path}"][method]
        responses = operation["responses"]
        assert "503" in responses, (method, path)
        # with the Retry-After the answer carries, as a header of that response only
        assert responses["503"]["headers"]["Retry-After"]["schema"]["type"] == "integer"
        assert all("headers" not in answer or "Retry-After" not in answer["headers"]
                   for code, answer in responses.items() if code != "503"), responses
        assert "Retry-After" not in {p["name"] for p in operation.get("parameters", [])}
