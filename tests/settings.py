"""Test settings: the test project's, plus the jobs defined for tests (tests/support/).

Under pytest-xdist each worker (``gw0``, ``gw1``, ...) gets its own Redis database: the one in
``JOBGUARD_REDIS_URL`` plus the worker's number, so one worker's flush never empties another's
keys. The shifted URL is written back to the environment (with ``JOBGUARD_XDIST_REDIS`` marking
it done), so that worker subprocesses the tests start use the same database without shifting
again. Test databases get per-worker names from pytest-django (``test_<name>_gw0``).
"""

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
from testproject.settings import JOBGUARD  # noqa: E402

JOBGUARD = {**JOBGUARD, "JOB_MODULES": [
    "tests.support.jobs", "tests.support.tasks", "tests.support.limit_jobs",
    "tests.support.lock_jobs", "tests.support.failure_jobs", "tests.support.testing_jobs",
    "tests.support.async_jobs",
    "tests.support.thread_jobs",
    *JOBGUARD["JOB_MODULES"]]}
