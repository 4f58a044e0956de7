"""Poison rows for tests: a queued row changed with raw SQL into what dispatch() never
writes (a counter at its column's maximum, a date the driver cannot load, a JSON null)."""

from __future__ import annotations

from django.db import connection

from django_jobguard import Job, dispatch_many
from django_jobguard.models import QueuedJob

#: The largest value each database's counter columns hold (PositiveIntegerField).
COLUMN_MAX = {"postgresql": 2**31 - 1, "mysql": 2**32 - 1, "sqlite": 2**63 - 1}

#: A created_at this database stores and its driver cannot load (SQL), or None.
UNLOADABLE_CREATED_AT = {"postgresql": "'infinity'", "sqlite": "'infinity'"}


def poison_row(job: Job, column: str, sql_value: str, *, priority: int | None = None) -> str:
    """Dispatch ``job``, then set its row's ``column`` to ``sql_value`` with raw SQL; its id."""
    (handle,) = dispatch_many([job], priority=priority)
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {quote(QueuedJob._meta.db_table)} SET {quote(column)} = "
                       f"{sql_value} WHERE {quote('id')} = %s",
                       [QueuedJob._meta.pk.get_db_prep_value(handle.id, connection)])
        assert cursor.rowcount == 1
    return str(handle.id)
