"""Where chains and batches continue: the pipeline asks :func:`skip_reason` before it runs a
job and calls :func:`finished` inside the transaction that acks a job or moves it to failed
jobs, and the retry operation calls :func:`retried` inside its transaction. A plain job (no
chain or batch in its payload) costs one dict lookup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_jobguard.conf import queue_database
from django_jobguard.workflows import batches, chains

__all__ = ["counted", "counted_in_batch", "finished", "involved", "retried", "skip_reason"]

_KEYS = (chains.MARKER, batches.MARKER)

#: What became of a job that finished for good.
SUCCEEDED, FAILED, SKIPPED = batches.SUCCEEDED, batches.FAILED, batches.SKIPPED


def involved(payload: Any) -> bool:
    """Is this job a chain link or a batch member (so finishing it needs a transaction)?"""
    if type(payload) is dict:  # a row's decoded JSON: asked several times a job
        return chains.MARKER in payload or batches.MARKER in payload
    return isinstance(payload, Mapping) and any(key in payload for key in _KEYS)


def counted_in_batch(payload: Any) -> str | None:
    """The batch of a job whose success only counts in its batch (not a chain link): the
    pipeline acks it and counts it in one statement (:func:`queue.ack_counting`)."""
    if not involved(payload) or chains.marker_of(payload) is not None:
        return None
    return batches.marker_of(payload)


def counted(batch_id: str, counts: tuple[int, int] | None, *,
            using: str | None = None) -> None:
    """A batch member was acked and counted (``counts``: ``(pending, failed)`` after it)."""
    using = queue_database(using)
    batches.counted(batch_id, counts, using=using)


def skip_reason(payload: Any, *, using: str | None = None) -> str:
    """Why a job must not run although it is due (its batch was cancelled), or ``""``."""
    if involved(payload) and batches.cancelled(payload, using=queue_database(using)):
        return "its batch was cancelled"
    return ""


def finished(payload: Any, *, outcome: str, job_id: str = "",
             using: str | None = None) -> None:
    """A job finished for good: ``succeeded``, ``failed`` (no tries left) or ``skipped``
    (cancelled)."""
    using = queue_database(using)
    if not involved(payload):
        return
    chains.advance(payload, succeeded=outcome == SUCCEEDED, using=using)
    batches.finished(payload, outcome=outcome, job_id=job_id, using=using)


def retried(payloads: list[Any], job_ids: list[str], *,
            using: str | None = None) -> None:
    """Failed jobs were queued again."""
    using = queue_database(using)
    pairs = [(p, i) for p, i in zip(payloads, job_ids, strict=True) if involved(p)]
    chains.retried([p for p, _ in pairs], using=using)
    batches.retried([p for p, _ in pairs], [i for _, i in pairs], using=using)
