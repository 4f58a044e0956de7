"""Fuzz the REST API from its OpenAPI schema (schemathesis, in-process WSGI, few examples):
no input may produce a server error, and every answer must match the schema."""

from __future__ import annotations

import base64
import contextlib
import os

import pytest
import schemathesis
from django.urls import include, path
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis import checks

from django_jobguard.api import urls

pytestmark = [pytest.mark.fuzz, pytest.mark.django_db]

# CI runs a few fixed examples per operation; JOBGUARD_FUZZ_EXAMPLES=500 searches harder.
EXAMPLES = int(os.environ.get("JOBGUARD_FUZZ_EXAMPLES", "8"))
AUTH = {"Authorization": "Basic " + base64.b64encode(b"fuzzer:pw").decode()}
# The document GET jobguard/api/schema/ serves (tests/test_api.py checks that one).
SCHEMA = SchemaGenerator(patterns=[path("jobguard/api/", include(urls.endpoint_patterns))]
                         ).get_schema(request=None, public=True)
schema = schemathesis.openapi.from_dict(SCHEMA)


@pytest.fixture
def wsgi_app(store_alias):
    """The test project as a WSGI app (once per store), a staff user for Basic auth, and one
    row of each kind. (It used pytest-django's ``settings`` before ``store_alias`` for a faster
    password hasher: torn down after the store's override, it put that override back for the
    rest of the process, ``STORE = "redis"`` included. tests/settings.py sets the hasher now.)"""
    from django.contrib.auth.models import User
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    from django_jobguard import get_store
    from tests.support.operate import failed_job_row, reserved, waiting

    stack = contextlib.ExitStack()
    User.objects.create_superuser("fuzzer", password="pw")
    waiting()
    reserved()
    failed_job_row()
    get_store().acquire("jobguard:overlap:fuzz", "o")
    try:
        get_store().throttles()
    except NotImplementedError:  # until the store lists throttles: fixed rows in its place
        from django_jobguard.conf import jobguard_settings
        from tests.support.operate import static_throttles

        stack.enter_context(static_throttles(jobguard_settings.STORE))
    # As Django's test client does: keep the test transaction's connection open.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
        stack.close()


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 8,
          suppress_health_check=list(HealthCheck))
def test_no_input_breaks_the_api(case, wsgi_app):
    # Left out: positive_data_acceptance (the schema cannot say which job names are registered
    # or which arguments each job takes, so schema-valid dispatches may rightly get 400s) and
    # ignored_auth (credentials come as a header here; test_api.py checks refusals).
    case.call_and_validate(app=wsgi_app, headers=AUTH, excluded_checks=[
        checks.positive_data_acceptance, checks.ignored_auth])
