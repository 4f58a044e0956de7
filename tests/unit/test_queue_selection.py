"""``--queue``'s syntax and the order a worker claims its queues in (weighted round robin)."""

from __future__ import annotations

from collections import Counter

import pytest

from django_jobguard.worker.queue_selection import QueueEntry, QueueSelection, parse_queues


def test_parse_names_and_numbers():
    assert parse_queues("high, default") == [QueueEntry("high"), QueueEntry("default")]
    assert parse_queues("default:10,emails:4,reports:1") == [
        QueueEntry("default", 10), QueueEntry("emails", 4), QueueEntry("reports", 1)]
    assert parse_queues("high:2,*:1") == [QueueEntry("high", 2), QueueEntry("*", 1)]
    assert parse_queues("*") == [QueueEntry("*")]


@pytest.mark.parametrize("text,problem", [
    ("", "no queue name"), (" , ", "no queue name"), (":3", "no queue name"),
    ("high:x", "whole number"), ("high:0", "at least 1"), ("high:1.5", "whole number"),
    ("high:3,default", "every queue a number or none"), ("a,a", "listed twice"),
])
def test_bad_queue_lists_say_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_queues(text)


class Queues:
    """A fake claim: ``work`` jobs waiting per queue; records which queue each claim hit."""

    def __init__(self, **work: int) -> None:
        self.work = Counter(work)
        self.calls: list[list[str]] = []
        self.taken: list[str] = []

    def claim(self, names, limit):
        self.calls.append(list(names))
        for name in names:
            if self.work[name]:
                got = min(limit, self.work[name])
                self.work[name] -= got
                self.taken += [name] * got
                return [name] * got
        return []


def picks(selection: QueueSelection, queues: Queues, n: int) -> str:
    for _ in range(n):
        selection.claim(queues.claim, free=1)
    return "".join(name[0] for name in queues.taken)


def test_without_numbers_the_order_is_strict_priority_in_one_claim():
    selection = QueueSelection(parse_queues("high,default"))
    queues = Queues(high=3, default=3)
    assert picks(selection, queues, 4) == "hhhd"  # default waits while high has work
    assert queues.calls[0] == ["high", "default"]


def test_weights_share_a_single_slot_three_to_one_and_never_starve_the_light_queue():
    selection = QueueSelection(parse_queues("high:3,default:1"))
    order = picks(selection, Queues(high=100, default=100), 40)
    assert order[:8] == "hhdhhhdh"  # smooth: list order breaks the tie of the second pick
    assert Counter(order) == {"h": 30, "d": 10}
    assert "hhhh" not in order  # default gets a job at least every fourth pick


def test_a_queue_with_nothing_due_banks_no_credit():
    selection = QueueSelection(parse_queues("high:3,default:1"))
    queues = Queues(high=100)
    picks(selection, queues, 20)  # default is empty meanwhile
    queues.work["default"] = 100
    queues.taken.clear()
    assert Counter(picks(selection, queues, 8)) == {"h": 6, "d": 2}  # no burst of default


def test_a_queue_at_its_number_is_not_claimed_and_claims_stay_within_it():
    selection = QueueSelection(parse_queues("reports:2,default:5"))
    queues = Queues(reports=10, default=10)
    assert selection.claim(queues.claim, free=10, running=Counter(reports=1)) in (
        ["reports"], ["default"] * 5)
    queues.calls.clear()
    selection.claim(queues.claim, free=10, running=Counter(reports=2, default=0))
    assert queues.calls == [["default"]]  # reports is full
    assert selection.claim(queues.claim, free=10, running=Counter(reports=2, default=5)) == []


def test_star_with_a_number_counts_every_other_queue_together():
    selection = QueueSelection(parse_queues("high:2,*:1"))
    assert selection.running(Counter(high=1, a=1, b=2)) == Counter(high=1, **{"*": 3})
    assert selection.entry_of("anything") == "*" and selection.entry_of("high") == "high"


def test_numbers_for_only_some_queues_are_refused_in_python_too():
    with pytest.raises(ValueError, match="every queue a number or none"):
        QueueSelection([QueueEntry("high", 3), QueueEntry("default")])
