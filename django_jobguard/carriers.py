"""Context carriers: what the code that dispatches a job knows about its surroundings (the
active language, the request's correlation id, the django-tenants schema), captured at
dispatch into the payload's ``context`` entry and restored around the job's run.

A carrier is any object with a ``name`` (its entry in ``context``), ``capture()`` (a
JSON-safe value, or ``None`` for nothing to carry) and ``restore(value)`` (a context manager
that puts the value in place for the run and takes it away after). ``JOBGUARD
["CONTEXT_CARRIERS"]`` lists them by dotted path (a class, instantiated without arguments,
or an instance); the built-in ones are :class:`Language`, :class:`CorrelationId` and
:class:`Tenant`. docs/jobs.md#context-propagation.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from django_jobguard.conf import jobguard_settings

__all__ = ["Carrier", "CorrelationId", "CorrelationIdMiddleware", "Language", "Tenant",
           "capture", "carriers", "correlation", "correlation_id", "restored",
           "set_correlation_id"]


@runtime_checkable
class Carrier(Protocol):
    """What a context carrier provides (see the module's docstring)."""

    name: str

    def capture(self) -> Any:
        """The value to carry (JSON-safe), or ``None`` when there is nothing to carry."""
        ...

    def restore(self, value: Any) -> AbstractContextManager[Any]:
        """Put ``value`` in place for the job's run; undone when the context manager exits."""
        ...


# -- built-in carriers ---------------------------------------------------------------------------

class Language:
    """The active language (``translation.get_language()``), activated for the run; nothing
    is carried while it is ``LANGUAGE_CODE`` (what a worker runs with anyway)."""

    name = "language"

    def capture(self) -> str | None:
        from django.conf import settings
        from django.utils import translation

        language = translation.get_language()
        return None if language == settings.LANGUAGE_CODE else language

    def restore(self, value: Any) -> AbstractContextManager[Any]:
        from django.utils import translation

        return translation.override(str(value))


_correlation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jobguard_correlation_id", default=None)


def correlation_id() -> str | None:
    """The correlation id of the request or job this code runs for (``None``: none set)."""
    return _correlation.get()


def set_correlation_id(value: str | None) -> contextvars.Token[str | None]:
    """Set the correlation id for this thread or task; returns the token to reset it."""
    if value is not None and (not isinstance(value, str) or not value or len(value) > 200):
        raise ValueError(f"A correlation id is a non-empty string of at most 200 characters, "
                         f"not {value!r}.")
    return _correlation.set(value)


@contextlib.contextmanager
def correlation(value: str) -> Iterator[None]:
    """The correlation id ``value`` inside the ``with`` block (a management command's, a
    consumer's): jobs dispatched there carry it."""
    token = set_correlation_id(value)
    try:
        yield
    finally:
        _correlation.reset(token)


class CorrelationId:
    """The correlation id (:func:`correlation_id`): a job runs with the id of the request
    (or job) that dispatched it, and the jobs it dispatches carry it on."""

    name = "correlation_id"

    def capture(self) -> str | None:
        return _correlation.get()

    def restore(self, value: Any) -> AbstractContextManager[None]:
        return correlation(str(value))


class CorrelationIdMiddleware:
    """Django middleware: the request's ``X-Request-ID`` (or ``X-Correlation-ID``) header, or
    a new id, as the correlation id while the request is handled, and in the response's
    ``X-Request-ID`` header. Sync only."""

    HEADERS = ("HTTP_X_REQUEST_ID", "HTTP_X_CORRELATION_ID")

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        value = next((request.META[h][:200] for h in self.HEADERS if request.META.get(h)),
                     None) or uuid.uuid4().hex
        token = _correlation.set(value)
        try:
            response = self.get_response(request)
        finally:
            _correlation.reset(token)
        response.headers.setdefault("X-Request-ID", value)
        return response


class Tenant:
    """The django-tenants schema of the database connection (``connection.schema_name``),
    set again with ``django_tenants.utils.schema_context`` for the run. Carries nothing
    without django-tenants (its connection has no ``schema_name``)."""

    name = "tenant"

    def capture(self) -> str | None:
        from django.db import connection

        schema = getattr(connection, "schema_name", None)
        return schema if isinstance(schema, str) and schema else None

    def restore(self, value: Any) -> AbstractContextManager[Any]:
        try:
            from django_tenants.utils import schema_context
        except ImportError:
            raise ImproperlyConfigured(
                f"This job was dispatched in django-tenants schema {value!r}, but "
                "django_tenants cannot be imported in this worker.") from None
        return schema_context(str(value))


# -- the registry -------------------------------------------------------------------------------

_loaded: tuple[Carrier, ...] | None = None


def carriers() -> tuple[Carrier, ...]:
    """The carriers of ``JOBGUARD["CONTEXT_CARRIERS"]``, loaded once (again when the
    setting changes)."""
    global _loaded
    if _loaded is None:
        _loaded = tuple(_load(path) for path in jobguard_settings.CONTEXT_CARRIERS)
        names = [carrier.name for carrier in _loaded]
        dupes = sorted({name for name in names if names.count(name) > 1})
        if dupes:
            _loaded = None
            raise ImproperlyConfigured(f"JOBGUARD['CONTEXT_CARRIERS'] has two carriers named "
                                       f"{', '.join(map(repr, dupes))}.")
    return _loaded


def _load(path: Any) -> Carrier:
    where = f"JOBGUARD['CONTEXT_CARRIERS'] entry {path!r}"
    if not isinstance(path, str):
        raise ImproperlyConfigured(f"{where} is not a dotted path.")
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{where} cannot be imported: {exc}") from exc
    carrier = found() if isinstance(found, type) else found
    name = getattr(carrier, "name", None)
    if not (isinstance(name, str) and name and callable(getattr(carrier, "capture", None))
            and callable(getattr(carrier, "restore", None))):
        raise ImproperlyConfigured(f"{where} is not a carrier: it needs a non-empty 'name', "
                                   "'capture()' and 'restore(value)'.")
    return carrier


def capture() -> dict[str, Any]:
    """What every carrier captures now (carriers that capture ``None`` left out)."""
    captured: dict[str, Any] = {}
    for carrier in carriers():
        value = carrier.capture()
        if value is None:
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"Context carrier {carrier.name!r} captured {value!r}, which is "
                            f"not JSON-safe ({exc}).") from None
        captured[carrier.name] = value
    return captured


_NOTHING_TO_RESTORE = contextlib.nullcontext()


def restored(context: Mapping[str, Any]) -> contextlib.AbstractContextManager[None]:
    """Every configured carrier's value from ``context`` in place (entries of carriers not
    configured here are left alone); a shared no-op for an empty ``context`` (most jobs:
    no generator made per job)."""
    return _restored(context) if context else _NOTHING_TO_RESTORE


@contextlib.contextmanager
def _restored(context: Mapping[str, Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for carrier in carriers():
            if context.get(carrier.name) is not None:
                stack.enter_context(carrier.restore(context[carrier.name]))
        yield


def _reset(*, setting: str, **kwargs: Any) -> None:
    global _loaded
    if setting == "JOBGUARD":
        _loaded = None


setting_changed.connect(_reset)
