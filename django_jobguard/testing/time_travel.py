"""The test clock: ``with clock() as c: c.advance(minutes=5)`` moves what the queue and both
stores see as "now" (see :mod:`django_jobguard.clock`), so delays, backoff, ``retry_until``,
unique and overlap lock expiry, rate-limit windows and circuits can be tested with no sleep.

Real time keeps running under it: the clock is the real one plus everything advanced so far.
Leaving the block deletes what the Redis stores wrote inside it (stamped with a shifted now),
see :mod:`django_jobguard.stores.journal`.
"""

from __future__ import annotations

import datetime
from contextlib import AbstractContextManager
from typing import Any

from django_jobguard import clock as jobguard_clock
from django_jobguard.stores import journal

__all__ = ["TestClock", "clock"]

_running: list[TestClock] = []


class TestClock:
    """A context manager shifting jobguard's "now" forward by what :meth:`advance` adds."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.advanced = datetime.timedelta()
        self._entered = False
        self._recording: AbstractContextManager[None] | None = None

    def __enter__(self) -> TestClock:
        if _running:
            raise RuntimeError("A test clock is already running; advance the one you have "
                               "instead of entering another (clock() cannot be nested).")
        if self._entered:
            raise RuntimeError("This test clock was used already; make a new one with clock().")
        self._entered = True
        _running.append(self)
        self._recording = journal.recording()
        self._recording.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        _running.remove(self)
        self.advanced = datetime.timedelta()
        _set_offset(0)
        if self._recording is not None:  # what was written at a shifted now goes too
            self._recording.__exit__(None, None, None)

    def advance(self, delta: datetime.timedelta | float | None = None, *, seconds: float = 0,
                minutes: float = 0, hours: float = 0, days: float = 0) -> datetime.datetime:
        """Move "now" forward (``advance(30)``, ``advance(minutes=5)`` or a timedelta) and
        return the new now; going back is a ``ValueError``."""
        if not _running or _running[-1] is not self:
            raise RuntimeError("advance() needs the test clock to be running: "
                               "`with clock() as c: c.advance(minutes=5)`.")
        if isinstance(delta, datetime.timedelta):
            step = delta.total_seconds()
        elif delta is None:
            step = 0.0
        elif isinstance(delta, (int, float)) and not isinstance(delta, bool):
            step = float(delta)
        else:
            raise TypeError(f"advance() takes seconds or a timedelta, not {delta!r}.")
        step += seconds + minutes * 60 + hours * 3600 + days * 86400
        if step < 0:
            raise ValueError(f"The test clock only moves forward: advance({step:g} s) would go "
                             "back in time.")
        self.advanced += datetime.timedelta(seconds=step)
        _shorten_store_ttls(step)
        _set_offset(self.advanced.total_seconds())
        return self.now()

    def now(self) -> datetime.datetime:
        """What jobguard takes as now (this process's clock, shifted)."""
        return jobguard_clock.now()


def _set_offset(seconds: float) -> None:
    """Shift the clock; the dialects (whose SQL has the offset written in) and the stores (which
    keep their dialect) are made again."""
    from django_jobguard import dialects, stores

    jobguard_clock.set_offset(seconds)
    dialects.reset()
    stores.reset()


def _shorten_store_ttls(seconds: float) -> None:
    """Redis expires keys on its own clock: bring the TTLs of the Redis stores in use closer."""
    from django_jobguard import stores
    from django_jobguard.stores.redis import RedisStore

    for store in list(stores._stores.values()):
        if isinstance(store, RedisStore) and seconds:
            store.shorten_ttls(seconds)


def clock() -> TestClock:
    """The test clock (a context manager); see :class:`TestClock`."""
    return TestClock()
