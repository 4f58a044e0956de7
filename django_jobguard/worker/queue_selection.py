"""Which of its queues a worker claims from next: ``--queue`` with or without numbers.

``--queue high,default,low`` is a strict priority order: every claim takes from the first
queue that has a due job, so a queue further down the list only runs while all those before
it are empty (a busy ``high`` starves ``low`` for as long as it stays busy, as in Laravel and
Sidekiq's strict ordering).

``--queue default:10,emails:4,reports:1`` gives each queue a number. It is the most jobs of
that queue this worker runs at once (with ``--threads``), and its weight when several queues
have work and the worker has fewer free slots than they could use: claims go to the queues in
a smooth weighted round robin (nginx's), in proportion to the numbers, the list order
breaking ties. ``--queue high:3,default:1`` on a one-slot worker takes three ``high`` jobs
per ``default`` job while both have work, and never starves ``default``. A queue that had
nothing to claim banks no credit, so it does not get a burst when work arrives. ``*`` (every
queue not named) may take a number too; its jobs count together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from django_jobguard.queue import ALL_QUEUES

T = TypeVar("T")


@dataclass(frozen=True)
class QueueEntry:
    """One queue of ``--queue`` and its number (``None``: no number)."""

    name: str
    limit: int | None = None


def parse_queues(text: str) -> list[QueueEntry]:
    """``"default:10,emails:4"`` → entries; :class:`ValueError` naming what is wrong."""
    entries: list[QueueEntry] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, number = part.partition(":")
        name = name.strip()
        if not name:
            raise ValueError(f"{part!r} has no queue name")
        limit = None
        if sep:
            try:
                limit = int(number)
            except ValueError:
                raise ValueError(f"{part!r}: the number after ':' must be a whole number of "
                                 f"jobs, not {number.strip()!r}") from None
            if limit < 1:
                raise ValueError(f"{part!r}: the number after ':' must be at least 1")
        if any(entry.name == name for entry in entries):
            raise ValueError(f"queue {name!r} is listed twice")
        entries.append(QueueEntry(name, limit))
    if not entries:
        raise ValueError("no queue name given")
    numbered = [entry.limit is not None for entry in entries]
    if any(numbered) and not all(numbered):
        bare = ", ".join(e.name for e in entries if e.limit is None)
        raise ValueError(f"give every queue a number or none (no number: {bare}); e.g. "
                         f"high:3,default:1")
    return entries


class QueueSelection:
    """The order in which a worker tries its queues at each claim (see the module
    docstring); ``weighted`` when the queues have numbers."""

    def __init__(self, entries: Sequence[QueueEntry]) -> None:
        self.entries = list(entries)
        self.names = [entry.name for entry in self.entries]
        self.weighted = any(entry.limit is not None for entry in self.entries)
        if self.weighted and any(entry.limit is None for entry in self.entries):
            raise ValueError("give every queue a number or none (queue_limits names "
                             "only some of the queues)")
        #: Each entry's number (every entry has one when ``weighted``).
        self._limits = {e.name: e.limit for e in self.entries if e.limit is not None}
        self._named = {name for name in self.names if name != ALL_QUEUES}
        self._credit = dict.fromkeys(self.names, 0)

    def entry_of(self, queue_name: str) -> str:
        """The entry a job of ``queue_name`` counts under (``*`` for a queue not named)."""
        return queue_name if queue_name in self._named or ALL_QUEUES not in self.names \
            else ALL_QUEUES

    def running(self, per_queue: Counter[str]) -> Counter[str]:
        """Running jobs per entry, from running jobs per queue name."""
        counts: Counter[str] = Counter()
        for name, count in per_queue.items():
            counts[self.entry_of(name)] += count
        return counts

    def claim(self, claim_one: Callable[[Sequence[str], int], list[T]], *, free: int,
              running: Counter[str] | None = None) -> list[T]:
        """Claim up to ``free`` jobs: ``claim_one(names, limit)`` claims from the first of
        ``names`` that has a due job. Without numbers that is one call with every queue in
        order; with numbers, one entry at a time in weighted order, none past its number."""
        if not self.weighted:
            return claim_one(self.names, free)
        running = running or Counter()
        limits = self._limits
        eligible = [(index, entry) for index, entry in enumerate(self.entries)
                    if running[entry.name] < limits[entry.name]]
        if not eligible or free < 1:
            return []
        for _, entry in eligible:
            self._credit[entry.name] += limits[entry.name]
        order = sorted(eligible, key=lambda item: (-self._credit[item[1].name], item[0]))
        # Smooth weighted round robin over the queues that have work: the winner gives back
        # the weights of this round's contenders. A queue found empty is no contender: its
        # credit of this round is taken back and it keeps none (no burst when work comes).
        contenders = sum(limits[entry.name] for _, entry in eligible)
        for _, entry in order:
            room = limits[entry.name] - running[entry.name]
            rows = claim_one([entry.name], min(free, room))
            if rows:
                self._credit[entry.name] -= contenders * len(rows)
                return rows
            contenders -= limits[entry.name]
            self._credit[entry.name] = min(self._credit[entry.name] - limits[entry.name], 0)
        return []
