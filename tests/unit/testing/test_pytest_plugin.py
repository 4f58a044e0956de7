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


def test_without_pytest_django_a_fixture_says_what_to_install(pytester):
    """Issue 30 item 7: the plugin works with pytest-django; without it, say so."""
    pytester.makepyfile(test_alone="""
        def test_capture(jobguard_capture):
            pass

        def test_no_fixture():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:django", "-p", "no:randomly",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*jobguard's pytest fixtures need pytest-django: pip install "
                                 "pytest-django*"])


def test_the_readme_says_what_the_plain_test_run_leaves_out_and_how_to_run_it():
    """Issue 30 item 7: every switch a skipped test waits for is in the README's test part."""
    import re

    from tests.support import ROOT
    from tests.support.browser import CHROMIUM

    readme = (ROOT / "README.md").read_text()
    part = readme[readme.index("Run the test suite"):readme.index("## Use")]
    chaos = set(re.findall(r'environ\.get\("(JOBGUARD_CHAOS_\w+)"', "".join(
        path.read_text() for path in (ROOT / "tests" / "chaos").glob("*.py"))))
    assert chaos  # the chaos tests' own switches
    for switch in {"JOBGUARD_TEST_DATABASE_URL", "JOBGUARD_REDIS_URL", CHROMIUM, *chaos}:
        assert switch in part, switch
    assert "skips" in part and "pytest-django" in readme
