"""System checks: each misconfiguration has an id and a message saying what to change."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_jobguard.checks import check_settings, check_sqlite_mode


def ids(errors) -> list[str]:
    return [e.id for e in errors]


def test_default_settings_pass():
    assert check_settings() == []


def test_not_a_dict():
    with override_settings(JOBGUARD=["nope"]):
        assert ids(check_settings()) == ["jobguard.E001"]


def test_unknown_key():
    with override_settings(JOBGUARD={"RETRY_AFTR": 5}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E001"] and "RETRY_AFTR" in errors[0].msg


def test_wrong_types_and_ranges():
    with override_settings(JOBGUARD={"RETRY_AFTER": "90", "USE_NOTIFY": 1, "CLAIM_BATCH_SIZE": 0}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E002"] * 3
    assert any("RETRY_AFTER'] must be int or float, not str" in e.msg for e in errors)


def test_retry_after_must_exceed_timeouts():
    with override_settings(JOBGUARD={"RETRY_AFTER": 30, "DEFAULT_TIMEOUT": 60}):
        errors = check_settings()
    assert "jobguard.E003" in ids(errors)
    assert "not less than JOBGUARD['RETRY_AFTER']" in errors[0].msg


def test_unknown_store():
    with override_settings(JOBGUARD={"STORE": "memcached"}):
        assert ids(check_settings()) == ["jobguard.E004"]
    with override_settings(JOBGUARD={"STORES": {"x": {"BACKEND": "no.such.Store"}}}):
        assert ids(check_settings()) == ["jobguard.E004"]


def test_redis_store_needs_a_django_redis_cache():
    with override_settings(JOBGUARD={"STORE": "redis"},
                           CACHES={"default": {"BACKEND":
                                   "django.core.cache.backends.locmem.LocMemCache"}}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E004"] and "not a django-redis cache" in errors[0].msg


def test_dispatchable_jobs_must_be_registered():
    with override_settings(JOBGUARD={"API_DISPATCHABLE_JOBS": ["nope.Job"]}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E005"]


def test_sqlite_without_immediate_mode_warns():
    from django.db import connections

    conn = connections["default"]
    if conn.vendor != "sqlite":
        pytest.skip("the warning is about SQLite databases")
    options = conn.settings_dict.setdefault("OPTIONS", {})
    saved = options.pop("transaction_mode", None)
    try:
        assert ids(check_sqlite_mode()) == ["jobguard.W001"]
    finally:
        if saved is not None:
            options["transaction_mode"] = saved
    assert check_sqlite_mode() == []
