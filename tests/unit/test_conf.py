"""The ``JOBGUARD`` keys declared once (``conf.SETTINGS``): the defaults, the type and range
check (jobguard.E002) and docs/settings.md's table all follow the declarations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from django.test import override_settings

from django_jobguard.checks import check_settings
from django_jobguard.conf import DEFAULTS, SETTINGS, Setting, jobguard_settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
CHECKED = [s for s in SETTINGS.values() if not s.checked_by]
RANGED = [s for s in CHECKED if s.above is not None or s.at_least is not None]


def _table() -> list[list[str]]:
    """The cells of the settings reference table, one list per row."""
    lines = DOCS.read_text().splitlines()
    start = lines.index("| key | default | accepts | meaning |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("| `"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _shown(value: object) -> str:
    """A default as the table writes it."""
    if value is None or isinstance(value, (bool, int, float)):
        return f"`{value!r}`"
    return f"`{json.dumps(value)}`"


def test_defaults_are_the_declared_ones():
    assert {name: s.default for name, s in SETTINGS.items()} == DEFAULTS
    assert all(name == s.name for name, s in SETTINGS.items())
    with override_settings(JOBGUARD={}):
        for name, setting in SETTINGS.items():
            assert getattr(jobguard_settings, name) == setting.default


def test_the_docs_table_lists_every_setting_as_declared():
    rows = _table()
    assert [row[0] for row in rows] == [f"`{name}`" for name in SETTINGS]
    for key, default, accepts, meaning in (row[:4] for row in rows):
        setting = SETTINGS[key.strip("`")]
        assert accepts == setting.accepts, key
        assert meaning, key
        if setting.name == "STORES":  # shown abridged
            assert default == '`{"database": {...}, "redis": {...}}`'
            assert set(setting.default) == {"database", "redis"}
        else:
            assert default == _shown(setting.default), key


def test_every_default_passes_its_own_declaration():
    assert [s.name for s in SETTINGS.values() if s.problem(s.default)] == []
    with override_settings(JOBGUARD={}):
        assert check_settings() == []


@pytest.mark.parametrize("setting", CHECKED, ids=lambda s: s.name)
def test_a_value_of_another_type_is_e002_naming_the_key(setting):
    with override_settings(JOBGUARD={setting.name: object()}):
        (error,) = check_settings()
    assert error.id == "jobguard.E002"
    assert error.msg.startswith(f"JOBGUARD['{setting.name}'] must be ")
    assert error.msg.endswith(", not object.")


@pytest.mark.parametrize("setting", RANGED, ids=lambda s: s.name)
def test_a_value_out_of_range_is_e002(setting):
    low = setting.above if setting.above is not None else setting.at_least - 1
    for bad in (low, math.nan):
        if bad is math.nan and float not in setting.types:
            continue
        with override_settings(JOBGUARD={setting.name: bad}):
            (error,) = check_settings()
        assert error.id == "jobguard.E002" and error.msg.startswith(
            f"JOBGUARD['{setting.name}'] must "), (setting.name, bad)


def test_a_key_with_its_own_check_is_not_e002():
    with override_settings(JOBGUARD={"UNKNOWN_JOB_GRACE": "soon"}):
        (error,) = check_settings()
    assert error.id == "jobguard.E040"


def test_problem_words():
    count = Setting("N", 1, (int,), "a count", above=0)
    assert count.problem(1) == ""
    assert count.problem(True) == "must be int, not bool."
    assert count.problem(0) == "must be greater than 0."
    seconds = Setting("S", None, (int, float, type(None)), "seconds", at_least=0)
    assert seconds.problem(None) == seconds.problem(0) == ""
    assert seconds.problem(-1) == "must not be negative."
    assert seconds.accepts == "int or float >= 0, or None"
    assert Setting("M", 2, (int,), "two", at_least=2).problem(1) == "must be at least 2."


def test_a_setting_read_is_kept_until_the_setting_changes():
    """A read keeps the value as an attribute (later reads skip ``__getattr__``); a change of
    ``JOBGUARD`` (``override_settings``, ``setting_changed``) drops what was kept."""
    configured = jobguard_settings.MAX_PAYLOAD_BYTES
    with override_settings(JOBGUARD={"MAX_PAYLOAD_BYTES": 1234}):
        assert jobguard_settings.MAX_PAYLOAD_BYTES == 1234
        assert vars(jobguard_settings)["MAX_PAYLOAD_BYTES"] == 1234
        with override_settings(JOBGUARD={"MAX_PAYLOAD_BYTES": 99}):
            assert "MAX_PAYLOAD_BYTES" not in vars(jobguard_settings)
            assert jobguard_settings.MAX_PAYLOAD_BYTES == 99
        assert jobguard_settings.MAX_PAYLOAD_BYTES == 1234
    assert configured == jobguard_settings.MAX_PAYLOAD_BYTES != 99
