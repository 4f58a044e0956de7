"""Test settings: the test project's, plus the jobs defined for tests (tests/jobs.py)."""

from testproject.settings import *  # noqa: F401,F403
from testproject.settings import JOBGUARD

JOBGUARD = {**JOBGUARD, "JOB_MODULES": ["tests.jobs", "tests.tasks", "tests.limit_jobs",
                                        "tests.lock_jobs", *JOBGUARD["JOB_MODULES"]]}
