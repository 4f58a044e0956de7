"""Helpers shared by the lock tests."""

from __future__ import annotations

import datetime

from django.db.models.functions import Now

from django_jobguard.models import Lock
from django_jobguard.stores import Store
from django_jobguard.stores.database import DatabaseStore
from tests.utils import make_due, wait_for, work

__all__ = ["expire", "make_due", "wait_for", "work"]


def expire(store: Store, key: str) -> None:
    """Make a held lock expire now, on the store's own terms (no waiting out its ttl)."""
    if isinstance(store, DatabaseStore):
        Lock.objects.using(store.using).filter(key=key).update(
            expires_at=Now() - datetime.timedelta(seconds=1))
    else:
        store.client.pexpire(key, 1)
        wait_for(lambda: not store.client.exists(key), timeout=5, interval=0.002)
    assert store.get_lock(key) is None


