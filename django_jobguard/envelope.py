"""The envelope: what a queued row's payload holds, typed, encoded once and decoded once.

``{"args": [...], "kwargs": {...}, "retry_until": "<iso>", "unique": {"key", "store",
"owner"}, "context": {<carrier name>: <value>}}`` (``context``: what the context carriers
captured at dispatch, :mod:`~django_jobguard.carriers`). Dispatch builds it and encodes it
to JSON text once (that text is what the size limit measures and what the row stores); the
worker decodes the row's payload once into an :class:`Envelope` and every layer reads its
typed fields. Keys it does not know are kept as they are, so a row written by a newer
release survives an older worker.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from django.utils import timezone

from django_jobguard.exceptions import PayloadError

_KNOWN = frozenset({"args", "kwargs", "retry_until", "unique", "context"})
# Not ASCII-escaped: the text is what the row stores, so its UTF-8 bytes are the size the
# database keeps (an escaped "é" measured 6 bytes for the 2 it takes).


def _compact_encoder() -> Callable[[Any], str]:
    """``json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode``, with the C
    encoder made once instead of per call (``encode`` builds one each time: a third of a
    dispatched job's encoding). Payloads are JSON trees built by the serializer, so the
    circular-reference check is left out."""
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the plain encoder
        return encoder.encode
    c_encode = make(None, encoder.default, json.encoder.encode_basestring, None, ":", ",",
                    False, False, True)

    def compact(value: Any) -> str:
        if isinstance(value, str):
            return encoder.encode(value)
        return "".join(c_encode(value, 0))

    return compact


_compact = _compact_encoder()


class UndecodedPayload(str):
    """A claimed row's payload text that did not decode as JSON (kept so the worker fails the
    job with a reason); ``reason`` says why, e.g. ``is not valid JSON (...)``."""

    reason: str

    def __new__(cls, text: str, reason: str) -> UndecodedPayload:
        value = super().__new__(cls, text)
        value.reason = reason
        return value


@dataclass(frozen=True, slots=True)
class UniqueRef:
    """The unique lock a queued job owns: released by exactly this owner, in this store."""

    key: str
    store: str
    owner: str

    def as_json(self) -> dict[str, str]:
        return {"key": self.key, "store": self.store, "owner": self.owner}

    @classmethod
    def from_json(cls, value: Any) -> UniqueRef | None:
        """The ref in a payload's ``unique`` entry, or ``None`` if it is missing or malformed."""
        if not isinstance(value, dict):
            return None
        key, store, owner = (value.get(name) for name in ("key", "store", "owner"))
        if not (isinstance(key, str) and isinstance(store, str) and isinstance(owner, str)
                and key and store and owner):
            return None
        return cls(key=key, store=store, owner=owner)


def _payload(args: list[Any], kwargs: dict[str, Any], retry_until: datetime.datetime | None,
             unique: UniqueRef | None, context: dict[str, Any],
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A row's payload as JSON data (:meth:`Envelope.as_json`, and
    :meth:`Envelope.encode_plain` without building an envelope)."""
    data: dict[str, Any] = {**extra, "args": args, "kwargs": kwargs} if extra else \
        {"args": args, "kwargs": kwargs}
    if retry_until is not None:
        data["retry_until"] = retry_until.isoformat()
    if unique is not None:
        data["unique"] = unique.as_json()
    if context:
        data["context"] = context
    return data


@dataclass(frozen=True, slots=True)
class Envelope:
    """A job's arguments (already JSON-safe, see :mod:`~django_jobguard.serialization`) and
    what dispatch decided for it."""

    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    retry_until: datetime.datetime | None = None
    unique: UniqueRef | None = None
    #: What the context carriers captured at dispatch, by carrier name.
    context: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return _payload(self.args, self.kwargs, self.retry_until, self.unique, self.context,
                        self.extra)

    def encode(self) -> str:
        """The compact JSON text stored in the row."""
        return _compact(self.as_json())

    @staticmethod
    def encode_plain(args: list[Any], kwargs: dict[str, Any],
                     retry_until: datetime.datetime | None, context: dict[str, Any]) -> str:
        """What ``Envelope(args=args, kwargs=kwargs, retry_until=retry_until,
        context=context).encode()`` gives (no unique lock, no extra entries), without
        building the envelope: ``dispatch_many`` encodes thousands of rows a call."""
        return _compact(_payload(args, kwargs, retry_until, None, context))

    def replace(self, **changes: Any) -> Envelope:
        return replace(self, **changes)

    @classmethod
    def decode(cls, payload: Any) -> Envelope:
        """The envelope of a row's payload (the decoded JSON); :class:`PayloadError` saying
        what is wrong with a payload no worker could run."""
        if isinstance(payload, UndecodedPayload):
            raise PayloadError(f"the stored payload {payload.reason}.")
        if not isinstance(payload, dict):
            raise PayloadError(f"expected a JSON object, got {type(payload).__name__}.")
        if len(payload) == 2:  # only args and kwargs (most rows): nothing else to check
            args, kwargs = payload.get("args"), payload.get("kwargs")
            if type(args) is list and type(kwargs) is dict:
                return cls(args, kwargs)
        args = payload.get("args", [])
        kwargs = payload.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise PayloadError("'args' must be a list and 'kwargs' an object.")
        context = payload.get("context") or {}
        if not isinstance(context, dict):
            raise PayloadError(f"'context' must be an object (carrier name: value), not "
                               f"{type(context).__name__}.")
        return cls(args=args, kwargs=kwargs,
                   retry_until=_deadline(payload.get("retry_until")),
                   unique=UniqueRef.from_json(payload.get("unique")), context=context,
                   extra={k: v for k, v in payload.items() if k not in _KNOWN})


def _deadline(value: Any) -> datetime.datetime | None:
    if value is None or value == "":
        return None
    try:
        deadline = datetime.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        deadline = None
    if deadline is None or timezone.is_naive(deadline):
        raise PayloadError(f"'retry_until' must be an ISO 8601 time with a time zone, not "
                           f"{value!r}.")
    try:  # a time that has no UTC equivalent (year 1 at +23:59) cannot be compared or stored
        deadline.astimezone(datetime.UTC)
    except OverflowError:
        raise PayloadError(f"'retry_until' {value!r} is out of the range of dates.") from None
    return deadline


def encoded_size(payload: Any) -> int:
    """UTF-8 bytes of a raw payload as compact JSON (what ``MAX_PAYLOAD_BYTES`` limits)."""
    text = _compact(payload)
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def unique_ref(payload: Any) -> UniqueRef | None:
    """The unique lock recorded in a raw payload, even one that does not decode otherwise
    (operators clearing rows, and failing a corrupt row, still free the lock)."""
    return UniqueRef.from_json(payload.get("unique")) if isinstance(payload, dict) else None
