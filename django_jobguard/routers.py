"""The database router for a queue on a database of its own (``JOBGUARD['DATABASE']``).

``DATABASE_ROUTERS = ["django_jobguard.routers.JobGuardRouter"]`` sends the reads, writes and
migrations of every django_jobguard model to that alias, and keeps every other app's tables
off it. With ``DATABASE`` left at ``"default"`` it decides nothing, so it is harmless to keep
installed. Put a router of your own that also routes to the queue's alias before this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS

from django_jobguard.conf import jobguard_settings

if TYPE_CHECKING:
    from django.db.models import Model

APP_LABEL = "django_jobguard"


def _separate() -> str | None:
    """The queue's alias when it is not ``default`` (the router's only case), else None."""
    alias = jobguard_settings.DATABASE
    return None if alias == DEFAULT_DB_ALIAS else alias


class JobGuardRouter:
    """Routes the queue's models (the ``django_jobguard`` app) to ``JOBGUARD['DATABASE']``."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        if model._meta.app_label == APP_LABEL:
            return _separate()
        return None

    db_for_write = db_for_read

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        """Relations inside the app are fine; one between the queue's database and another
        cannot be a foreign key."""
        if _separate() is None:
            return None
        inside = [obj._meta.app_label == APP_LABEL for obj in (obj1, obj2)]
        if all(inside):
            return True
        return False if any(inside) else None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None,
                      **hints: Any) -> bool | None:
        """The app's tables on the queue's alias only; nothing else's there."""
        queue = _separate()
        if queue is None:
            return None
        if app_label == APP_LABEL:
            return db == queue
        return False if db == queue else None
