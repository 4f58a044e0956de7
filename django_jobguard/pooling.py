"""Transaction-pooling connection poolers (PgBouncer): which database aliases go through one
(``JOBGUARD["PGBOUNCER"]``) and where a worker LISTENs (``JOBGUARD["LISTEN_DATABASE"]``).

Behind PgBouncer in transaction pooling mode a client holds a server connection only for one
transaction. jobguard keeps no session state (no ``SET``, no advisory locks, no temporary
tables: every lock is a row, every statement is complete in its transaction), so dispatch,
claims, acks, locks and counters work through it. Two things do not:

- ``LISTEN``: the server connection that ran it goes back to the pool, and PgBouncer drops the
  notifications it later gets ("got packet 'A' from server when not linked"). A worker LISTENs
  on ``LISTEN_DATABASE``, a direct connection, or polls.
- named server-side prepared statements (psycopg's ``prepare_threshold``): PgBouncer < 1.21
  sends the next ``EXECUTE`` to a server that never saw the ``PREPARE``.

Why an explicit setting rather than detection: PgBouncer is invisible in SQL (it passes the
server's version and parameters through), so no query tells a pooled connection from a direct
one; the setting is what system checks read. What a worker depends on at run time, a NOTIFY
reaching its LISTEN, is probed anyway at start-up (:mod:`django_jobguard.dialects.postgresql`),
so a pooler nobody declared costs wake-up latency (polling at ``--sleep``), never a hang.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

from django_jobguard.conf import jobguard_settings


def vendor(alias: str) -> str | None:
    """The vendor (``"postgresql"``, ``"mysql"``, ...) of the ``DATABASES`` alias, read from
    its ``ENGINE`` without connecting; ``None`` for an unknown alias or engine."""
    config = settings.DATABASES.get(alias)
    if not isinstance(config, dict) or not config.get("ENGINE"):
        return None
    try:
        return import_string(f"{config['ENGINE']}.base.DatabaseWrapper").vendor
    except ImportError:
        return None


def pooled_aliases() -> list[str]:
    """The aliases declared behind a transaction-pooling PgBouncer: ``PGBOUNCER = True`` means
    every PostgreSQL alias but ``LISTEN_DATABASE``; a list names them."""
    declared = jobguard_settings.PGBOUNCER
    if declared is True:
        return [alias for alias in settings.DATABASES
                if alias != jobguard_settings.LISTEN_DATABASE
                and vendor(alias) == "postgresql"]
    if isinstance(declared, (list, tuple)):
        return [alias for alias in declared if isinstance(alias, str)]
    return []


def behind_pgbouncer(alias: str) -> bool:
    """Whether ``alias`` is declared behind a transaction-pooling PgBouncer."""
    return alias in pooled_aliases()


def listen_alias(using: str) -> str:
    """The alias a worker on the queue database ``using`` LISTENs on."""
    return jobguard_settings.LISTEN_DATABASE or using
