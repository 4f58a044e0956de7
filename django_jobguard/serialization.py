"""JSON payloads: job arguments in, job arguments out. Never pickle.

Model instances travel as references (app label, model, pk) and are fetched again when the job
runs; dates, times, UUIDs and Decimals are tagged so they come back as the same type.
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from typing import Any

from django.apps import apps
from django.db import models

TAG = "__jobguard__"


class MissingModelError(LookupError):
    """A model instance passed to a job no longer exists."""


def encode(value: Any, *, path: str) -> Any:
    """Turn ``value`` into JSON-safe data, or raise ``TypeError`` (a type JSON cannot hold) or
    ``ValueError`` (a value no database stores alike: NaN, infinity, NUL, a lone surrogate)
    naming ``path``."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return check_text(value, path=path)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"Job argument {path} is {value!r}: JSON has no NaN or infinity "
                             f"(PostgreSQL refuses it, SQLite stores it); pass None or a "
                             f"string instead.")
        return value
    if isinstance(value, models.Model):
        if value.pk is None:
            raise TypeError(f"Job argument {path} is an unsaved {type(value).__name__}; save it "
                            f"first (jobs receive models by primary key).")
        meta = value._meta
        return {TAG: "model", "model": meta.label_lower, "pk": encode(value.pk, path=path)}
    if isinstance(value, datetime.datetime):
        return {TAG: "datetime", "value": value.isoformat()}
    if isinstance(value, datetime.date):
        return {TAG: "date", "value": value.isoformat()}
    if isinstance(value, datetime.time):
        return {TAG: "time", "value": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {TAG: "timedelta", "value": value.total_seconds()}
    if isinstance(value, uuid.UUID):
        return {TAG: "uuid", "value": str(value)}
    if isinstance(value, decimal.Decimal):
        return {TAG: "decimal", "value": str(value)}
    if isinstance(value, (list, tuple)):
        return [encode(item, path=f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"Job argument {path} has a non-string key {key!r}; JSON objects "
                                f"need string keys.")
            if key == TAG:
                raise TypeError(f"Job argument {path} uses the reserved key {TAG!r}.")
            check_text(key, path=f"a key of {path}")
            out[key] = encode(item, path=f"{path}[{key!r}]")
        return out
    raise TypeError(
        f"Job argument {path} is a {type(value).__module__}.{type(value).__qualname__}, which "
        f"cannot be stored as JSON. Pass plain data, a saved model instance, or its id."
    )


def check_text(text: str, *, path: str) -> str:
    """``text`` if every database stores it alike; ``ValueError`` naming ``path`` for a NUL
    character (PostgreSQL refuses it) or a lone surrogate (not encodable as UTF-8)."""
    if "\x00" in text:
        raise ValueError(f"Job argument {path} contains a NUL character (\\x00), which "
                         f"PostgreSQL cannot store; remove it or pass bytes as base64.")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"Job argument {path} contains a lone surrogate "
                             f"({text[exc.start]!r} at {exc.start}), which is not valid "
                             f"UTF-8.") from None
    return text


def references_models(value: Any) -> bool:
    """Whether the encoded ``value`` holds a model reference (:func:`decode` would query)."""
    if not value:
        return False
    if isinstance(value, (list, tuple)):
        return any(references_models(item) for item in value)
    if not isinstance(value, dict):
        return False
    tag = value.get(TAG)
    if tag is None:
        return any(references_models(item) for item in value.values())
    return tag == "model"


def decode(value: Any) -> Any:
    """Inverse of :func:`encode`; model references are fetched (``MissingModelError`` if gone)."""
    if not value:  # no arguments (most often): nothing to rebuild
        return value
    if isinstance(value, list):
        return [decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(TAG)
    if tag is None:
        return {key: decode(item) for key, item in value.items()}
    if tag == "model":
        model = apps.get_model(value["model"])
        try:
            return model._default_manager.get(pk=decode(value["pk"]))
        except model.DoesNotExist:
            raise MissingModelError(
                f"{model._meta.label} with pk={value['pk']!r} no longer exists."
            ) from None
    if tag == "datetime":
        return datetime.datetime.fromisoformat(value["value"])
    if tag == "date":
        return datetime.date.fromisoformat(value["value"])
    if tag == "time":
        return datetime.time.fromisoformat(value["value"])
    if tag == "timedelta":
        return datetime.timedelta(seconds=value["value"])
    if tag == "uuid":
        return uuid.UUID(value["value"])
    if tag == "decimal":
        return decimal.Decimal(value["value"])
    raise ValueError(f"Unknown payload tag {tag!r}.")
