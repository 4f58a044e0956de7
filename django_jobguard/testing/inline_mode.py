"""Inline mode: ``JOBGUARD["TEST_MODE"] = "inline"`` runs each dispatched job at once, in the
dispatching process, through the worker's pipeline (see docs/testing.md for the caveats).

The row is inserted as usual and then claimed and run before ``dispatch()`` returns, delayed or
not. Jobs dispatched by an inline job run after it, not inside it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.test import override_settings

from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.testing import draining
from django_jobguard.worker.pipeline import Pipeline

__all__ = ["inline", "run_inline"]


def run_inline(job_ids: Sequence[str], *, using: str | None = None) -> list[str]:
    """Claim and run the just-queued rows ``job_ids`` now; returns the states they ended in.

    Called by ``dispatch()`` in inline mode. While a job runs, the jobs it dispatches wait
    for it to finish (so the time limit and the rows of the outer job stay its own)."""
    using = queue_database(using)
    pending: list[str] | None = getattr(draining.running, "inline_pending", None)
    if pending is not None:  # inside an inline run: queue behind it
        pending.extend(job_ids)
        return []
    if getattr(draining.running, "active", False):  # inside drain(): it runs them
        return []
    me = draining.worker_id("inline")
    pipeline = Pipeline(worker_id=me, using=using, log_running=False, pause=lambda s: None)
    states: list[str] = []
    draining.running.inline_pending = pending = list(job_ids)
    try:
        while pending:
            row = draining.claim_row(pending.pop(0), worker_id=me, delayed=True, using=using)
            if row is not None:
                states.append(pipeline.process(row))
    finally:
        draining.running.inline_pending = None
    return states


@contextmanager
def inline() -> Iterator[None]:
    """Inline mode inside the block (``override_settings`` of ``JOBGUARD["TEST_MODE"]``)."""
    current: dict[str, Any] = dict(jobguard_settings.user_settings)
    with override_settings(JOBGUARD={**current, "TEST_MODE": "inline"}):
        yield
