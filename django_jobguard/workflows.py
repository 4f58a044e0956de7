"""Where chains and batches continue: the pipeline calls :func:`finished` inside the
transaction that acks a job or moves it to failed jobs, and the retry operation calls
:func:`retried` inside its transaction. A plain job (no chain or batch in its payload) costs
one dict lookup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_jobguard import chains

__all__ = ["finished", "involved", "retried"]

_KEYS = (chains.MARKER,)


def involved(payload: Any) -> bool:
    """Is this job a chain link or a batch member (so finishing it needs a transaction)?"""
    return isinstance(payload, Mapping) and any(key in payload for key in _KEYS)


def finished(payload: Any, *, succeeded: bool, job_id: str = "",
             using: str = DEFAULT_DB_ALIAS) -> None:
    """A job finished for good (acked, or failed with no tries left)."""
    if not involved(payload):
        return
    chains.advance(payload, succeeded=succeeded, using=using)


def retried(payloads: list[Any], *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Failed jobs were queued again."""
    chains.retried([p for p in payloads if involved(p)], using=using)
