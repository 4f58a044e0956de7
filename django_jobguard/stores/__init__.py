"""Lock and counter stores, looked up by alias from ``JOBGUARD['STORES']``."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from django_jobguard.conf import jobguard_settings
from django_jobguard.stores.base import LockInfo, Store, ThrottleInfo

__all__ = ["LockInfo", "Store", "ThrottleInfo", "get_store", "reset"]

_stores: dict[str, Store] = {}


def get_store(alias: str | None = None) -> Store:
    """The store named ``alias`` (default ``JOBGUARD['STORE']``), created once per process."""
    alias = alias or jobguard_settings.STORE
    store = _stores.get(alias)
    if store is None:
        config = jobguard_settings.STORES.get(alias)
        if config is None:
            raise ImproperlyConfigured(
                f"JOBGUARD['STORES'] has no store named {alias!r} "
                f"(known: {sorted(jobguard_settings.STORES)})."
            )
        options = {k.lower(): v for k, v in config.items() if k != "BACKEND"}
        store = import_string(config["BACKEND"])(alias=alias, **options)
        _stores[alias] = store
    return store


def reset() -> None:
    """Forget created stores (after settings change in tests)."""
    _stores.clear()


def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBGUARD":  # a store's configuration may have changed (tests)
        reset()


setting_changed.connect(_reset_on_change)
