"""Test settings: the test project's, plus the jobs defined for tests (tests/support/).

Under pytest-xdist each worker (``gw0``, ``gw1``, ...) gets its own Redis database: the one in
``JOBGUARD_REDIS_URL`` plus the worker's number, so one worker's flush never empties another's
keys. The shifted URL is written back to the environment (with ``JOBGUARD_XDIST_REDIS`` marking
it done), so that worker subprocesses the tests start use the same database without shifting
again. Test databases get per-worker names from pytest-django (``test_<name>_gw0``).

A second alias, ``queue``, is where the separate-queue-database tests put the queue
(tests/integration/test_separate_database.py, ``JOBGUARD['DATABASE'] = "queue"``): the database
of ``JOBGUARD_TEST_QUEUE_DATABASE_URL``, or by default one beside the default database, of the
same kind (``<name>_queue`` on a server, a second file on SQLite). pytest-django creates its
test database only for tests that ask for it. Worker subprocesses get its test name in
``JOBGUARD_QUEUE_DB_NAME`` and the queue's alias in ``JOBGUARD_DATABASE``.
"""

import json
import os
import re


def _redis_url_for_xdist_worker(url: str, worker: str) -> str:
    """``url`` with its database number raised by the xdist worker's number (``gw1``: +1)."""
    match = re.fullmatch(r"(redis://[^/]+)(?:/(\d+))?/?", url)
    if not match:
        raise ValueError(f"JOBGUARD_REDIS_URL {url!r} is not redis://host:port/<db>")
    db = int(match.group(2) or 0) + int(worker.removeprefix("gw"))
    if db > 15:
        raise ValueError(f"JOBGUARD_REDIS_URL {url!r}: xdist worker {worker} would need Redis "
                         f"database {db}; use a lower database number or fewer workers")
    return f"{match.group(1)}/{db}"


_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if (_WORKER and os.environ.get("JOBGUARD_REDIS_URL")
        and os.environ.get("JOBGUARD_XDIST_REDIS") != _WORKER):
    os.environ["JOBGUARD_REDIS_URL"] = _redis_url_for_xdist_worker(
        os.environ["JOBGUARD_REDIS_URL"], _WORKER)
    os.environ["JOBGUARD_XDIST_REDIS"] = _WORKER

from testproject.settings import *  # noqa: E402,F401,F403
from testproject.settings import (  # noqa: E402
    BASE_DIR,
    CACHES,
    DATABASE_URL,
    DATABASES,
    JOBGUARD,
    database_from_url,
)

JOBGUARD = {**JOBGUARD, "JOB_MODULES": [
    "tests.support.jobs", "tests.support.tasks", "tests.support.limit_jobs",
    "tests.support.lock_jobs", "tests.support.failure_jobs", "tests.support.testing_jobs",
    "tests.support.async_jobs",
    "tests.support.thread_jobs", "tests.support.long_jobs",
    *JOBGUARD["JOB_MODULES"]]}

# Worker subprocesses of the PgBouncer tests (tests/support/pgbouncer.py): the test database
# through the test's PgBouncer, declared in JOBGUARD["PGBOUNCER"] or not, and optionally a
# direct alias for LISTEN.
if os.environ.get("JOBGUARD_TEST_PGBOUNCER_PORT"):
    _direct = dict(DATABASES["default"])
    DATABASES["default"] = {**_direct, "PORT": os.environ["JOBGUARD_TEST_PGBOUNCER_PORT"],
                            "DISABLE_SERVER_SIDE_CURSORS": True}
    if os.environ.get("JOBGUARD_TEST_PGBOUNCER_DECLARED") == "1":
        JOBGUARD["PGBOUNCER"] = ["default"]
    if os.environ.get("JOBGUARD_TEST_LISTEN_DIRECT") == "1":
        DATABASES["listen"] = _direct
        JOBGUARD["LISTEN_DATABASE"] = "listen"

# Worker subprocesses of the partition tests (tests/chaos/test_partition.py): a "host" whose
# database connections go through the test's fault-injecting proxy (tests/support/netproxy.py)
# on JOBGUARD_TEST_DB_PORT, with the connection OPTIONS of JOBGUARD_TEST_DB_OPTIONS (JSON:
# connect_timeout, statement_timeout, keepalives), and its Redis cache with the django-redis
# OPTIONS of JOBGUARD_TEST_REDIS_OPTIONS (SOCKET_TIMEOUT...); its JOBGUARD_REDIS_URL names the
# proxy already.
if os.environ.get("JOBGUARD_TEST_DB_PORT"):
    DATABASES["default"] = {**DATABASES["default"], "HOST": "127.0.0.1",
                            "PORT": os.environ["JOBGUARD_TEST_DB_PORT"]}
if os.environ.get("JOBGUARD_TEST_DB_OPTIONS"):
    DATABASES["default"] = {**DATABASES["default"], "OPTIONS": {
        **DATABASES["default"].get("OPTIONS", {}),
        **json.loads(os.environ["JOBGUARD_TEST_DB_OPTIONS"])}}
if os.environ.get("JOBGUARD_TEST_PGBOUNCER_PORT"):
    # configured for PgBouncer: no prepared statements, even where the suite runs with them
    # (JOBGUARD_TEST_DB_OPTIONS='{"prepare_threshold": 5}', one of .ci/run's suites)
    DATABASES["default"]["OPTIONS"] = {
        k: v for k, v in DATABASES["default"].get("OPTIONS", {}).items()
        if k != "prepare_threshold"}
if os.environ.get("JOBGUARD_TEST_REDIS_OPTIONS"):
    _redis_options = json.loads(os.environ["JOBGUARD_TEST_REDIS_OPTIONS"])
    CACHES = {**CACHES, "default": {**CACHES["default"], "OPTIONS": _redis_options}}

if os.environ.get("JOBGUARD_DATABASE"):  # a worker subprocess of a separate-queue test
    JOBGUARD["DATABASE"] = os.environ["JOBGUARD_DATABASE"]

_QUEUE_URL = os.environ.get("JOBGUARD_TEST_QUEUE_DATABASE_URL", "")
if _QUEUE_URL or DATABASE_URL:
    queue_db = database_from_url(_QUEUE_URL or DATABASE_URL.rstrip("/") + "_queue")
else:
    queue_db = {**DATABASES["default"], "OPTIONS": dict(DATABASES["default"]["OPTIONS"]),
                "NAME": str(BASE_DIR / "db-queue.sqlite3"),
                "TEST": {"NAME": str(BASE_DIR / f".test-queue-{os.getpid()}.sqlite3")}}
if os.environ.get("JOBGUARD_QUEUE_DB_NAME"):
    queue_db["NAME"] = os.environ["JOBGUARD_QUEUE_DB_NAME"]
# A worker subprocess (JOBGUARD_DB_NAME, tests/support/processes.py) has the queue alias only
# when its test put the queue there (JOBGUARD_DATABASE): Django 6.1's check of a GeneratedField
# (the queue's debounce_slot) connects to every alias the app may migrate to, at every
# command's start, and the queue's test database exists only once a test has asked for it.
if not os.environ.get("JOBGUARD_DB_NAME") or os.environ.get("JOBGUARD_DATABASE"):
    DATABASES = {**DATABASES, "queue": queue_db}
# Password hashing is not what these tests are about: Django's default (PBKDF2, 10^6 rounds)
# costs about half a CPU-second for each user a test creates or logs in, which adds up to minutes
# of a suite on a 2-core machine (Django's docs, "Speeding up the tests").
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Decides nothing while JOBGUARD['DATABASE'] is "default" (every test but the separate ones).
DATABASE_ROUTERS = ["django_jobguard.routers.JobGuardRouter"]
