"""Waiting for an event (never for a fixed time): the tests' and the benchmarks' one loop.
Imports nothing from Django, so bench/ can use it before Django is set up."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any


class WaitTimeout(AssertionError, TimeoutError):
    """The awaited condition did not come true in time (a test failure, and a timeout)."""


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05, *,
             what: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy and return its value (an event we wait for, not a
    timed assertion); :class:`WaitTimeout` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise WaitTimeout(f"{what} not met within {timeout} s")


def wait_for_gate(gate: str) -> None:
    """Block until the file ``gate`` exists: a test holds the jobs that started until it has
    looked (the gate is opened by creating the file), instead of hoping they are slow enough."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {gate} was never opened")
        time.sleep(0.01)


async def await_gate(gate: str) -> None:
    """:func:`wait_for_gate` for an async job: awaits, so the event loop goes on meanwhile."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {gate} was never opened")
        await asyncio.sleep(0.01)
