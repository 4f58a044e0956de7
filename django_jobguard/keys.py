"""Store keys of locks, rate-limit windows and circuits: built, parsed and shortened here.

Every key is ``jobguard:<kind>:<parts…>``:

- ``jobguard:unique:<job name>:<unique id>``            (:mod:`django_jobguard.unique_jobs`)
- ``jobguard:debounce:<job name>:<debounce id>``        (:mod:`django_jobguard.debounce`)
- ``jobguard:overlap:<job name>:<key>`` or ``jobguard:overlap:<key>`` when shared
- ``jobguard:rate:<limiter>:<window>s[:<by>]``
- ``jobguard:circuit:<job name>`` / ``…:<job name>:<job id>`` / ``…:<shared key>``

The parts come from users (ids, limiter keys), so a key longer than :data:`MAX_LENGTH` keeps
its readable start and ends in a digest of the whole: distinct inputs stay distinct and every
store accepts the key.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

PREFIX = "jobguard:"
KINDS = ("unique", "overlap", "rate", "circuit", "debounce")
#: Longest key built here; stores accept 255 characters, and the Redis store's fencing counter
#: of a lock adds ``{}`` and ``:fence`` (stores/redis.py, ``fence_key``).
MAX_LENGTH = 200
_KEEP = 160  # readable characters kept in front of the digest of a long key


def part(value: Any) -> str:
    """A key part from a user value: enums by value, ``None`` as empty."""
    if isinstance(value, enum.Enum):
        value = value.value
    return "" if value is None else str(value)


def build(kind: str, *parts: Any) -> str:
    """``jobguard:<kind>:<parts joined by ':'>``, shortened with a digest when too long."""
    if kind not in KINDS:
        raise ValueError(f"Unknown key kind {kind!r}; expected one of {', '.join(KINDS)}.")
    return shorten(PREFIX + ":".join([kind, *(part(p) for p in parts)]))


def shorten(key: str) -> str:
    """``key`` if it fits :data:`MAX_LENGTH`, else its start plus a digest of all of it."""
    if len(key) <= MAX_LENGTH:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{key[:_KEEP]}:{digest}"


def unique(job_name: str, unique_id: Any) -> str:
    return build("unique", job_name, unique_id)


def debounce(job_name: str, debounce_id: Any) -> str:
    return build("debounce", job_name, debounce_id)


def overlap(job_name: str, key: Any, *, shared: bool = False) -> str:
    return build("overlap", key) if shared else build("overlap", job_name, key)


def rate(limiter: str, window_seconds: float, by: Any = "") -> str:
    """The window's length is part of the key, so ``per_minute(10)`` and ``per_day(1000)`` by
    the same user count separately."""
    by = part(by)
    return build("rate", limiter, f"{window_seconds:g}s", *([by] if by else []))


def circuit(*parts: Any) -> str:
    return build("circuit", *parts)


def kind(key: str) -> str:
    """The ``<kind>`` of ``jobguard:<kind>:<…>`` (``unique``, ``overlap``, …), or ``other``."""
    head, _, rest = key.partition(":")
    name, sep, _ = rest.partition(":")
    return name if head + ":" == PREFIX and name and sep else "other"


def label(key: str) -> str:
    """The key without ``jobguard:<kind>:``, for messages (``twilio-api`` of a circuit)."""
    kind_name = kind(key)
    return key[len(PREFIX) + len(kind_name) + 1:] if kind_name != "other" else key


def prefix(kind_name: str | None = None) -> str:
    """The prefix of every key of ``kind_name`` (every jobguard key when ``None``)."""
    if kind_name is None:
        return PREFIX
    if kind_name not in KINDS:
        raise ValueError(f"Unknown key kind {kind_name!r}; expected one of {', '.join(KINDS)}.")
    return f"{PREFIX}{kind_name}:"
