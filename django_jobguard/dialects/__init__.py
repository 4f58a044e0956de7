"""Database dialects: every difference between the databases jobguard runs on, behind one
interface (:class:`~django_jobguard.dialects.base.Dialect`), one module per dialect.

The queue and the database store ask :func:`dialect_for` and never which vendor they are on.
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.db import connections

from django_jobguard.dialects.base import (
    Dialect,
    Listener,
    ListenUnavailable,
    NewJob,
    ThrottleRow,
)

__all__ = ["Dialect", "ListenUnavailable", "Listener", "NewJob", "ThrottleRow", "dialect_for",
           "reset"]

_dialects: dict[str, Dialect] = {}


def dialect_for(using: str) -> Dialect:
    """The dialect of the connection alias ``using`` (one object per alias, shared by all
    threads: it holds SQL text, never a connection)."""
    try:
        return _dialects[using]
    except KeyError:
        return _dialects.setdefault(using, _make(using))


def _make(using: str) -> Dialect:
    vendor = connections[using].vendor
    if vendor == "postgresql":
        from django_jobguard.dialects.postgresql import PostgreSQLDialect

        return PostgreSQLDialect(using)
    if vendor == "sqlite":
        from django_jobguard.dialects.sqlite import SQLiteDialect

        return SQLiteDialect(using)
    if vendor == "mysql":
        from django_jobguard.dialects.mysql import MySQLDialect

        return MySQLDialect(using)
    from django_jobguard.dialects.mysql import GenericDialect

    return GenericDialect(using)


def reset() -> None:
    """Forget the dialects made so far (the next :func:`dialect_for` builds them again)."""
    _dialects.clear()


def _forget(*, setting: str, **kwargs: Any) -> None:
    """An alias can point at another database after ``override_settings(DATABASES=...)``."""
    if setting == "DATABASES":
        _dialects.clear()


setting_changed.connect(_forget)
