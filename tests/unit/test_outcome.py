"""django_jobguard.outcome: what each :class:`Outcome` constructor records about a run, and
the job line states (``JobState``) declared once, with what the log, metrics, tracing, history
and ``drain()`` derive from them.

How the pipeline applies each kind to the row (ack, release, deferral, failed job, cancel) is
covered by the feature tests: tests/unit/test_worker.py (done, released, deferred, failed;
dropped in ``test_missing_model_fails_with_reason_or_is_deleted``) and
tests/unit/operations/test_cancel.py (cancelled).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest
from django.core.management.color import color_style

from django_jobguard import JobState, history, logs, tracing
from django_jobguard.durations import NOW, Due
from django_jobguard.metrics import recording
from django_jobguard.outcome import Kind, Outcome
from django_jobguard.testing.draining import DrainResult
from django_jobguard.worker import RecentOutcomes

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: The states as logs, metrics labels and API output have always spelled them.
SPELLED = ["RUNNING", "DONE", "SKIPPED", "DELETED", "CANCELLED", "RELEASED", "FAILED", "LOST"]


def test_done_keeps_the_result_and_leaves_the_queue():
    outcome = Outcome.done({"rows": 3})
    assert outcome.kind is Kind.DONE
    assert outcome.result == {"rows": 3}
    assert outcome.exception is None and outcome.reason == "" and outcome.detail == ""
    assert not outcome.goes_back
    assert Outcome.done().result is None


def test_dropped_names_why_and_leaves_the_queue():
    assert Outcome.dropped().reason == "dropped"
    outcome = Outcome.dropped("missing model")
    assert (outcome.kind, outcome.reason) == (Kind.DROPPED, "missing model")
    assert not outcome.goes_back


def test_released_goes_back_and_uses_an_attempt():
    error = RuntimeError("503")
    later = Due(delay=30.0)
    outcome = Outcome.released(later, reason="exception", exception=error,
                               detail="twilio down")
    assert outcome.kind is Kind.RELEASED and outcome.goes_back
    assert outcome.due == later
    assert outcome.exception is error
    assert outcome.counts_attempt and outcome.counts_exception
    assert (outcome.reason, outcome.detail) == ("exception", "twilio down")


def test_a_release_after_a_handled_exception_does_not_count_it():
    outcome = Outcome.released(NOW, exception=ValueError("x"), counts_exception=False)
    assert outcome.reason == "released"  # the default reason
    assert outcome.counts_attempt and not outcome.counts_exception


def test_deferred_goes_back_without_using_an_attempt_unless_told():
    outcome = Outcome.deferred(Due(delay=5.0), reason="overlap",
                               detail="circuit 'sms' was open")
    assert outcome.kind is Kind.DEFERRED and outcome.goes_back
    assert not outcome.counts_attempt
    assert (outcome.reason, outcome.detail) == ("overlap", "circuit 'sms' was open")
    assert Outcome.deferred(NOW).reason == "deferred"
    # JOBGUARD['DEFERRALS_CONSUME_ATTEMPTS'] makes the pipeline ask for a counted deferral.
    assert Outcome.deferred(NOW, counts_attempt=True).counts_attempt


def test_failed_keeps_the_exception_and_which_limit_ended_the_job():
    error = RuntimeError("kaput")
    outcome = Outcome.failed(error, reason="exception", detail="its last try (3 of 3) raised")
    assert outcome.kind is Kind.FAILED and not outcome.goes_back
    assert outcome.exception is error
    assert (outcome.reason, outcome.detail) == ("exception", "its last try (3 of 3) raised")
    assert Outcome.failed(error).reason == "failed"


def test_cancelled_says_who_asked():
    outcome = Outcome.cancelled()
    assert outcome.kind is Kind.CANCELLED and not outcome.goes_back
    assert (outcome.reason, outcome.detail) == ("cancelled", "cancelled by an operator")
    assert Outcome.cancelled("its batch was cancelled").detail == "its batch was cancelled"


def test_only_released_and_deferred_go_back_to_the_queue():
    going_back = {kind for kind in Kind if Outcome(kind).goes_back}
    assert going_back == {Kind.RELEASED, Kind.DEFERRED}


def test_an_outcome_cannot_be_changed_once_decided():
    outcome = Outcome.done(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.kind = Kind.FAILED  # type: ignore[misc]


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
