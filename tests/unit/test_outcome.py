"""How a run ended: the job line states (``JobState``) declared once, and the state each
outcome kind logs; what the log, metrics, tracing, history and ``drain()`` derive from them."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from django.core.management.color import color_style

from django_jobguard import JobState, history, logs, tracing
from django_jobguard.durations import NOW
from django_jobguard.metrics import recording
from django_jobguard.outcome import Kind, Outcome
from django_jobguard.testing.draining import DrainResult
from django_jobguard.worker import RecentOutcomes

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: The states as logs, metrics labels and API output have always spelled them.
SPELLED = ["RUNNING", "DONE", "SKIPPED", "DELETED", "CANCELLED", "RELEASED", "FAILED", "LOST"]


def test_the_states_keep_their_strings_and_compare_as_plain_strings():
    assert [state.value for state in JobState] == SPELLED
    for state in JobState:
        assert state.name == state == str(state) == f"{state}"
        assert hash(state) == hash(state.value)  # so "DONE" in a set of states works
    assert "DONE" in JobState.finished() and "FAILED" not in JobState.finished()


def test_finished_and_failure_states():
    assert JobState.finished() == {"DONE", "SKIPPED", "DELETED", "CANCELLED"}
    assert [s for s in JobState if s.is_done] == ["DONE", "SKIPPED", "DELETED", "CANCELLED"]
    assert [s for s in JobState if s.is_failure] == ["FAILED", "LOST"]
    assert [s for s in JobState if s.is_timed] == ["DONE", "FAILED"]


@pytest.mark.parametrize("outcome, state", [
    (Outcome.done(), "DONE"),
    (Outcome.dropped("skipped"), "SKIPPED"),
    (Outcome.released(NOW), "RELEASED"),
    (Outcome.deferred(NOW), "RELEASED"),  # a deferral goes back to the queue too
    (Outcome.failed(ValueError("x")), "FAILED"),
    (Outcome.cancelled(), "CANCELLED"),
])
def test_each_outcome_kind_logs_one_state(outcome, state):
    assert outcome.state == state and isinstance(outcome.state, JobState)


def test_every_kind_has_a_state():
    assert {Outcome(kind).state for kind in Kind} <= set(JobState)


def test_the_done_sets_are_the_one_declaration():
    assert RecentOutcomes.DONE is history.DONE_STATES is JobState.finished()
    assert history.FAILED_STATE is JobState.FAILED
    assert sorted(recording.TIMED) == ["DONE", "FAILED"]
    assert sorted(tracing._ERRORS) == ["FAILED", "LOST"]
    assert logs.LEVELS == {"RUNNING": logging.DEBUG, "FAILED": logging.WARNING,
                           "LOST": logging.WARNING}


def test_the_palette_colours_done_released_failed_and_lost():
    style = color_style(force_color=True)
    palette = logs.palette(style)
    assert set(palette) == {"DONE", "RELEASED", "FAILED", "LOST"}
    assert palette["DONE"]("x") == style.SUCCESS("x")
    assert palette["RELEASED"]("x") == style.WARNING("x")
    assert palette["FAILED"]("x") == palette["LOST"]("x") == style.ERROR("x")


def test_drain_counts_each_state_that_ends_a_run():
    result = DrainResult()
    for state in JobState:
        if state is not JobState.RUNNING:
            result.add(state)
    result.add("DONE")  # a plain string counts too
    assert (result.done, result.skipped, result.deleted, result.cancelled, result.released,
            result.failed, result.lost) == (2, 1, 1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="'BOGUS' is not a valid JobState"):
        result.add("BOGUS")


def test_the_docs_name_every_state():
    row = next(line for line in (DOCS / "observe.md").read_text().splitlines()
               if line.startswith("| `state` |"))
    assert re.findall(r"`([A-Z]+)`", row.split("|")[3]) == SPELLED
