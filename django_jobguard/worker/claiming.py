"""How many jobs a worker asks for per claim: one without a backlog, several with one.

:class:`ClaimSize` is the worker's adaptive claim. A claim that came back full says there is a
backlog, and the next asks for twice as many, up to :data:`MAX_CLAIM`; one that came back
short goes back to one. The size is also capped so that the jobs claimed ahead are worth
about :data:`AHEAD_SECONDS` of work at the recent average job duration: a backlog of
millisecond jobs is claimed up to 128 at a time (one round trip instead of 128), a backlog
of one-second jobs one at a time (no worker sits on jobs an idle one could run). Rows claimed
ahead keep their lease renewed by the heartbeat, count their attempt only when they start,
and are given back on shutdown.
"""

from __future__ import annotations

#: The most rows one adaptive claim asks for.
MAX_CLAIM = 128
#: Work (in seconds, at the recent average duration) a worker may hold claimed ahead.
AHEAD_SECONDS = 0.05
#: Weight of the newest job in the running average of job durations.
_SMOOTHING = 0.2


class ClaimSize:
    """The size of the next claim (``fixed`` sizes, from ``--batch`` or
    ``CLAIM_BATCH_SIZE``, never change)."""

    def __init__(self, fixed: int | None = None, *, most: int = MAX_CLAIM,
                 ahead_seconds: float = AHEAD_SECONDS) -> None:
        self.fixed = fixed
        self.most = most
        self.ahead_seconds = ahead_seconds
        self.average: float | None = None  # seconds per job, smoothed
        self._next = 1

    def next(self) -> int:
        """How many rows to ask for now."""
        if self.fixed:
            return self.fixed
        if self.average and self.average > 0:
            return max(1, min(self._next, int(self.ahead_seconds / self.average)))
        return self._next

    def claimed(self, asked: int, got: int) -> None:
        """Record a claim's result: full means a backlog, so ask for more next time."""
        self._next = min(self.most, max(1, asked * 2)) if got >= asked else 1

    def finished(self, seconds: float) -> None:
        """Record how long a job took (wall clock, claim to outcome)."""
        self.average = seconds if self.average is None else (
            self.average + _SMOOTHING * (seconds - self.average))
