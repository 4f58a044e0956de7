"""The checks of the databases themselves: W001 (SQLite without ``IMMEDIATE`` transactions)
and E020 (no ``SKIP LOCKED``, asked of the server: tagged ``database``)."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register
from django.db import connections


@register(Tags.compatibility)
def check_sqlite_mode(app_configs: Any = None, **kwargs: Any) -> list:
    warnings = []
    for alias in connections:
        conn = connections[alias]
        if conn.vendor != "sqlite":
            continue
        mode = (conn.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if mode != "IMMEDIATE":
            warnings.append(Warning(
                f"Database {alias!r} is SQLite without transaction_mode IMMEDIATE; several "
                f"workers at once may fail with 'database is locked'.",
                hint="DATABASES[...]['OPTIONS'] = {'transaction_mode': 'IMMEDIATE', "
                     "'timeout': 20}",
                id="jobguard.W001",
            ))
    return warnings


@register(Tags.database)
def check_skip_locked(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """jobguard.E020 for each of ``databases`` that cannot claim with SKIP LOCKED."""
    from django_jobguard.dialects.mysql import missing_skip_locked

    errors = []
    for alias in databases or ():
        problem = missing_skip_locked(connections[alias])
        if problem:
            errors.append(Error(
                f"Database {alias!r}: {problem}; concurrent workers would block on each "
                f"other's claims.",
                hint="Upgrade the server (MariaDB 10.6+, MySQL 8.0.1+), or keep the queue on "
                     "PostgreSQL or SQLite.",
                id="jobguard.E020",
            ))
    return errors
