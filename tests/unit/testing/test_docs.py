"""Every example of docs/testing.md runs: each ``python`` block is a file of a throwaway
project (named by the ``<!-- file: path -->`` comment before it), and pytest runs them all."""

from __future__ import annotations

import re

from tests.support import ROOT
from tests.support.throwaway import run_project

pytest_plugins = ["pytester"]

PAGE = ROOT / "docs" / "testing.md"
BLOCK = re.compile(r"(?:<!-- file: (?P<path>\S+) -->\n)?```python\n(?P<code>.*?)```", re.S)


def examples() -> dict[str, str]:
    files = {}
    for match in BLOCK.finditer(PAGE.read_text()):
        assert match["path"], f"a python block of {PAGE.name} has no file comment:\n{match[0]}"
        files[match["path"]] = match["code"]
    return files


def test_every_example_of_the_testing_page_passes(pytester):
    files = examples()
    tests = sum(len(re.findall(r"^\s*def test_", code, re.M)) for code in files.values())
    assert len(files) == PAGE.read_text().count("```python")  # no block left out or overwritten
    assert tests > 0
    result = run_project(pytester, files)
    result.assert_outcomes(passed=tests)
