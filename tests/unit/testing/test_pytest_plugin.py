"""The pytest plugin, loaded through its ``pytest11`` entry point in a throwaway project that
has no conftest (pytester runs pytest there in a subprocess)."""

from __future__ import annotations

import textwrap

from tests.support.throwaway import run_project

pytest_plugins = ["pytester"]

JOBS = """
from django_jobguard import Job

DONE = []


class SyncStock(Job):
    queue = "stock"

    def __init__(self, product_id):
        self.product_id = product_id

    def handle(self):
        DONE.append(self.product_id)


class PlaceOrder(Job):
    def __init__(self, product_id):
        self.product_id = product_id

    def handle(self):
        SyncStock(self.product_id).dispatch()
"""

TESTS = """
import pytest

from shop.jobs import DONE, PlaceOrder, SyncStock

pytestmark = pytest.mark.django_db


def test_capture(jobguard_capture):
    PlaceOrder(42).dispatch()
    jobguard_capture.assert_dispatched(PlaceOrder, args=(42,), count=1)
    jobguard_capture.assert_not_dispatched(SyncStock)


def test_drain(jobguard_capture, jobguard_drain):
    PlaceOrder(7).dispatch()
    assert jobguard_drain().done == 2
    assert DONE[-1] == 7
    jobguard_capture.assert_dispatched(SyncStock, args=(7,), queue="stock")


def test_inline(jobguard_inline):
    PlaceOrder(5).dispatch()
    assert DONE[-1] == 5


def test_failing_assertion_shows_the_dispatched_jobs(jobguard_capture):
    SyncStock(41).dispatch()
    jobguard_capture.assert_dispatched(SyncStock, args=(42,))
"""


def test_plugin_fixtures_work_without_a_conftest(pytester):
    result = run_project(pytester, {"shop/jobs.py": textwrap.dedent(JOBS),
                                    "test_shop.py": textwrap.dedent(TESTS)})
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "*Expected shop.jobs.SyncStock with args=(42,) to be dispatched at least once, but it "
        "was dispatched 0 time(s).*",
        "*- shop.jobs.SyncStock(41) queue='stock'*",
    ])
