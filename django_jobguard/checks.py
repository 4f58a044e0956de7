"""System checks for ``JOBGUARD`` and the databases jobguard uses (``manage.py check``).

Ids:
- jobguard.E001 ``JOBGUARD`` is not a dict, or has an unknown key.
- jobguard.E002 a setting has the wrong type or range.
- jobguard.E003 ``RETRY_AFTER`` is not larger than a job's (or the default) ``timeout``.
- jobguard.E004 ``STORE`` names no entry in ``STORES``, or a store's ``BACKEND`` cannot load.
- jobguard.E005 ``API_DISPATCHABLE_JOBS`` names a job that is not registered.
- jobguard.E006 ``API_PERMISSION_CLASSES`` names a class that cannot be imported (checked when
  djangorestframework is installed).
- jobguard.W001 SQLite without ``"transaction_mode": "IMMEDIATE"``: concurrent workers may
  fail with "database is locked".
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections
from django.utils.module_loading import import_string

from django_jobguard.conf import DEFAULTS, jobguard_settings

_TYPES: dict[str, tuple[type, ...]] = {
    "DEFAULT_QUEUE": (str,),
    "RETRY_AFTER": (int, float),
    "DEFAULT_TIMEOUT": (int, float),
    "CLAIM_BATCH_SIZE": (int,),
    "MAX_PAYLOAD_BYTES": (int,),
    "JOB_MODULES": (list, tuple),
    "USE_NOTIFY": (bool,),
    "STORE": (str,),
    "STORES": (dict,),
    "DEFERRALS_CONSUME_ATTEMPTS": (bool,),
    "API_DISPATCHABLE_JOBS": (list, tuple),
    "API_PERMISSION_CLASSES": (list, tuple),
    "RESULT_RETENTION_DAYS": (int, float),
}
_POSITIVE = {"RETRY_AFTER", "CLAIM_BATCH_SIZE"}
_NON_NEGATIVE = {"DEFAULT_TIMEOUT", "MAX_PAYLOAD_BYTES", "RESULT_RETENTION_DAYS"}


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list:
    raw = getattr(settings, "JOBGUARD", {})
    if not isinstance(raw, dict):
        return [Error("JOBGUARD must be a dict.", hint="JOBGUARD = {'RETRY_AFTER': 90, ...}",
                      id="jobguard.E001")]
    errors: list = []
    for key in sorted(set(raw) - set(DEFAULTS)):
        errors.append(Error(f"JOBGUARD has an unknown key {key!r}.",
                            hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                            id="jobguard.E001"))
    for key, types in _TYPES.items():
        value = getattr(jobguard_settings, key)
        wrong_type = not isinstance(value, types) or (isinstance(value, bool)
                                                      and bool not in types)
        if wrong_type:
            expected = " or ".join(t.__name__ for t in types)
            errors.append(Error(f"JOBGUARD['{key}'] must be {expected}, not "
                                f"{type(value).__name__}.", id="jobguard.E002"))
        elif key in _POSITIVE and value <= 0:
            errors.append(Error(f"JOBGUARD['{key}'] must be greater than 0.", id="jobguard.E002"))
        elif key in _NON_NEGATIVE and value < 0:
            errors.append(Error(f"JOBGUARD['{key}'] must not be negative.", id="jobguard.E002"))
    if errors:
        return errors
    return (errors + _check_timeouts() + _check_stores() + _check_dispatchable()
            + _check_api_permissions())


def _check_timeouts() -> list:
    from django_jobguard import registry

    retry_after = jobguard_settings.RETRY_AFTER
    errors = []
    timeouts = {"JOBGUARD['DEFAULT_TIMEOUT']": jobguard_settings.DEFAULT_TIMEOUT}
    timeouts.update({name: cls.timeout for name, cls in registry.all_jobs().items()
                     if cls.timeout})
    for name, timeout in timeouts.items():
        if timeout and timeout >= retry_after:
            errors.append(Error(
                f"{name} has timeout {timeout} s, not less than JOBGUARD['RETRY_AFTER'] = "
                f"{retry_after} s: a job still running could be given to a second worker.",
                hint="Raise RETRY_AFTER above the largest timeout (by a few seconds).",
                id="jobguard.E003",
            ))
    return errors


def _check_stores() -> list:
    stores = jobguard_settings.STORES
    errors = []
    if jobguard_settings.STORE not in stores:
        errors.append(Error(f"JOBGUARD['STORE'] = {jobguard_settings.STORE!r} is not a key of "
                            f"JOBGUARD['STORES'] ({', '.join(sorted(stores))}).",
                            id="jobguard.E004"))
    for alias, config in stores.items():
        if not isinstance(config, dict) or "BACKEND" not in config:
            errors.append(Error(f"JOBGUARD['STORES'][{alias!r}] needs a 'BACKEND' dotted path.",
                                id="jobguard.E004"))
            continue
        if alias != jobguard_settings.STORE and alias in DEFAULTS["STORES"]:
            continue  # built-in stores are only checked when used
        try:
            backend = import_string(config["BACKEND"])
        except ImportError as exc:
            errors.append(Error(f"JOBGUARD['STORES'][{alias!r}]['BACKEND'] cannot be imported: "
                                f"{exc}", id="jobguard.E004"))
            continue
        check = getattr(backend, "check_config", None)
        if check is not None:
            errors.extend(check(alias, config))
    return errors


def _check_dispatchable() -> list:
    from django_jobguard import registry

    known = registry.all_jobs()
    return [
        Error(f"JOBGUARD['API_DISPATCHABLE_JOBS'] names {name!r}, which is not a registered job.",
              hint="Use the job's registered name (module.ClassName or its `name`).",
              id="jobguard.E005")
        for name in jobguard_settings.API_DISPATCHABLE_JOBS if name not in known
    ]


def _check_api_permissions() -> list:
    from importlib.util import find_spec

    if find_spec("rest_framework") is None:
        return []
    errors = []
    for entry in jobguard_settings.API_PERMISSION_CLASSES:
        if not isinstance(entry, str):
            continue
        try:
            import_string(entry)
        except ImportError as exc:
            errors.append(Error(f"JOBGUARD['API_PERMISSION_CLASSES'] names {entry!r}, which "
                                f"cannot be imported: {exc}", id="jobguard.E006"))
    return errors


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
