"""The checks of the databases themselves: W001 (SQLite without ``IMMEDIATE`` transactions),
E020 (no ``SKIP LOCKED``, asked of the server) and W020 (jobguard's migrations not applied);
the last two are tagged ``database``."""

from __future__ import annotations

import sys
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


@register(Tags.database)
def check_migrated(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """jobguard.W020 when the queue's database (if checked) lacks jobguard's migrations."""
    from django.conf import settings

    from django_jobguard import queue
    from django_jobguard.conf import jobguard_settings

    if sys.argv[1:2] == ["migrate"]:  # what it would say is being done
        return []
    alias = jobguard_settings.DATABASE
    if (not isinstance(alias, str) or alias not in (databases or ())
            or alias not in settings.DATABASES):
        return []
    missing = queue.unapplied_migrations(alias)
    if not missing:
        return []
    return [Warning(queue.migrate_message(missing, alias), id="jobguard.W020",
                    hint="Workers refuse to start and dispatch() fails until it has run.")]
