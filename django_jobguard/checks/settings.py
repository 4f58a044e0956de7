"""The checks of the ``JOBGUARD`` setting (``check_settings``: E001, E002, and then E003/W003,
E004-E007, E040, E070, E080, E100-E105, E110-E112, W110, W111, E120, E121, E130, E150,
E160, E161, and
each store's own: the Redis store's E140-E142, W140) and of the periodic schedules
(``check_schedules``: E060-E064, W050)."""

from __future__ import annotations

import difflib
from typing import Any, TypeGuard

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections
from django.utils.module_loading import import_string

from django_jobguard.checks.sources import limiter_errors
from django_jobguard.conf import DEFAULTS, SETTINGS, jobguard_settings
from django_jobguard.worker.timeouts import hard_limit


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list:
    raw = getattr(settings, "JOBGUARD", {})
    if not isinstance(raw, dict):
        return [Error("JOBGUARD must be a dict.", hint="JOBGUARD = {'RETRY_AFTER': 90, ...}",
                      id="jobguard.E001")]
    errors: list = []
    for key in sorted(set(raw) - set(DEFAULTS), key=str):
        close = difflib.get_close_matches(str(key).upper(), list(DEFAULTS), n=1, cutoff=0.6)
        errors.append(Error(f"JOBGUARD has an unknown key {key!r}."
                            + (f" Did you mean {close[0]!r}?" if close else ""),
                            hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                            id="jobguard.E001"))
    for key, setting in SETTINGS.items():  # type and range, as conf.SETTINGS declares them
        problem = "" if setting.checked_by else setting.problem(getattr(jobguard_settings, key))
        if problem:
            errors.append(Error(f"JOBGUARD['{key}'] {problem}", id="jobguard.E002"))
    if errors:
        return errors
    return (errors + _check_timeouts() + _check_stores() + _check_dispatchable()
            + _check_api_permissions() + limiter_errors() + _check_reliability() + _check_history()
            + _check_test_mode() + _check_embedded_worker() + _check_pgbouncer()
            + _check_metrics_token() + _check_database()
            + _check_queues() + _check_slo())


def _check_metrics_token() -> list:
    """jobguard.E130: ``METRICS_TOKEN`` is too short to be a secret."""
    token = jobguard_settings.METRICS_TOKEN
    if token is None or len(token.strip()) >= 16:
        return []
    return [Error("JOBGUARD['METRICS_TOKEN'] must be at least 16 characters (or None).",
                  hint="Generate one with python -c 'import secrets; "
                       "print(secrets.token_urlsafe(32))' and read it from the environment.",
                  id="jobguard.E130")]


def _check_database() -> list:
    """jobguard.E120/E121: the queue's alias exists, and the routers send the app's models to it."""
    from django.db import DEFAULT_DB_ALIAS, router

    from django_jobguard.models import QueuedJob

    alias = jobguard_settings.DATABASE
    if alias not in connections:
        return [Error(f"JOBGUARD['DATABASE'] = {alias!r} is not in DATABASES "
                      f"(known: {', '.join(sorted(connections))}).", id="jobguard.E120")]
    if alias == DEFAULT_DB_ALIAS:
        return []
    routed = {"reads": router.db_for_read(QueuedJob), "writes": router.db_for_write(QueuedJob)}
    wrong = [f"{what} go to {went!r}" for what, went in routed.items() if went != alias]
    if not router.allow_migrate_model(alias, QueuedJob):
        wrong.append(f"migrations are not allowed on {alias!r}")
    if not wrong:
        return []
    return [Error(
        f"JOBGUARD['DATABASE'] = {alias!r}, but the queue's {', '.join(wrong)}.",
        hint="Add 'django_jobguard.routers.JobGuardRouter' to DATABASE_ROUTERS (before any "
             "router that sends every model to one database).", id="jobguard.E121")]


def _check_reliability() -> list:
    """jobguard.E040–E049: the settings of the reliability features (issue 12)."""
    errors: list = []
    grace = jobguard_settings.UNKNOWN_JOB_GRACE
    if SETTINGS["UNKNOWN_JOB_GRACE"].problem(grace):
        errors.append(Error(f"JOBGUARD['UNKNOWN_JOB_GRACE'] must be a number of seconds >= 0, "
                            f"not {grace!r}.",
                            hint="600 (the default) waits 10 minutes for a newer worker to "
                                 "take a job this one does not know; 0 fails it at once.",
                            id="jobguard.E040"))
    return errors


HISTORY_MODES = ("off", "failures", "all")


def _check_history() -> list:
    """jobguard.E150: ``HISTORY`` names no mode."""
    mode = jobguard_settings.HISTORY
    if mode in HISTORY_MODES:
        return []
    return [Error(f"JOBGUARD['HISTORY'] must be one of {', '.join(map(repr, HISTORY_MODES))}, "
                  f"not {mode!r}.",
                  hint="'failures' keeps the runs that failed for good; 'all' every finished "
                       "run (docs/operate.md, Finished-job history).", id="jobguard.E150")]


TEST_MODES = ("", "inline")


def _check_test_mode() -> list:
    """jobguard.E070: ``TEST_MODE`` names no mode."""
    mode = jobguard_settings.TEST_MODE
    if mode in TEST_MODES:
        return []
    return [Error(f"JOBGUARD['TEST_MODE'] must be \"\" or \"inline\", not {mode!r}.",
                  hint='Use "inline" to run every dispatch at once in tests, or leave it out.',
                  id="jobguard.E070")]


def _check_embedded_worker() -> list:
    """jobguard.E080: ``EMBEDDED_WORKER`` has an unknown key or a value out of range."""
    from django_jobguard.worker.embedded import DEFAULTS as EMBEDDED

    config = jobguard_settings.EMBEDDED_WORKER
    if not config:
        return []
    problems = [f"unknown key {key!r}" for key in sorted(set(config) - set(EMBEDDED))]
    threads, tries = config.get("threads", 1), config.get("tries", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        problems.append(f"'threads' must be an int >= 1, not {threads!r}")
    if isinstance(tries, bool) or not isinstance(tries, int) or tries < 0:
        problems.append(f"'tries' must be an int >= 0 (0: unlimited), not {tries!r}")
    for key in ("sleep", "shutdown_timeout"):
        value = config.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            problems.append(f"{key!r} must be a number of seconds >= 0, not {value!r}")
    queues = config.get("queues")
    if queues is not None and (not isinstance(queues, (list, tuple)) or not queues or not all(
            isinstance(q, str) and q and "," not in q for q in queues)):
        problems.append(f"'queues' must be a non-empty list of queue names (or '*'), not "
                        f"{queues!r}")
    return [Error(f"JOBGUARD['EMBEDDED_WORKER']: {problem}.",
                  hint='e.g. {"threads": 2, "queues": ["*"], "shutdown_timeout": 20}; '
                       "see docs/worker.md#embedded-worker.",
                  id="jobguard.E080") for problem in problems]


def _check_pgbouncer() -> list:
    """jobguard.E110–E112, W110, W111: ``LISTEN_DATABASE`` and ``PGBOUNCER`` (pooling.py)."""
    from django_jobguard import pooling

    known = settings.DATABASES
    listen = jobguard_settings.LISTEN_DATABASE
    docs = "See docs/databases.md#pgbouncer."
    errors: list = []
    if listen is not None and listen not in known:
        errors.append(Error(f"JOBGUARD['LISTEN_DATABASE'] = {listen!r} is not a key of "
                            f"DATABASES ({', '.join(sorted(known))}).",
                            hint="Add an alias with a direct connection (not through "
                                 "PgBouncer) to the queue's PostgreSQL database. " + docs,
                            id="jobguard.E110"))
    elif listen is not None and pooling.vendor(listen) != "postgresql":
        errors.append(Error(f"JOBGUARD['LISTEN_DATABASE'] = {listen!r} is not a PostgreSQL "
                            f"database ({pooling.vendor(listen) or 'unknown ENGINE'}): only "
                            f"PostgreSQL has LISTEN/NOTIFY.",
                            hint="Name a PostgreSQL alias, or remove the setting (workers on "
                                 "other databases poll at --sleep). " + docs,
                            id="jobguard.E111"))
    declared = jobguard_settings.PGBOUNCER
    if isinstance(declared, (list, tuple)):
        for alias in declared:
            if not isinstance(alias, str) or alias not in known:
                errors.append(Error(f"JOBGUARD['PGBOUNCER'] names {alias!r}, which is not a "
                                    f"key of DATABASES.", hint=docs, id="jobguard.E112"))
            elif pooling.vendor(alias) != "postgresql":
                errors.append(Error(f"JOBGUARD['PGBOUNCER'] names {alias!r}, which is not a "
                                    f"PostgreSQL database.", hint=docs, id="jobguard.E112"))
            elif alias == listen:
                errors.append(Error(f"JOBGUARD['PGBOUNCER'] names {alias!r}, the "
                                    f"LISTEN_DATABASE: LISTEN needs a direct connection.",
                                    hint=docs, id="jobguard.E112"))
    if errors:
        return errors
    for alias in pooling.pooled_aliases():
        config = known[alias]
        if not config.get("DISABLE_SERVER_SIDE_CURSORS"):
            errors.append(Warning(
                f"Database {alias!r} is behind PgBouncer in transaction pooling mode "
                f"(JOBGUARD['PGBOUNCER']) without DISABLE_SERVER_SIDE_CURSORS: a "
                f"QuerySet.iterator() outside a transaction fetches on another server "
                f"connection than the one that holds its cursor.",
                hint=f"DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True. " + docs,
                id="jobguard.W110"))
        if (config.get("OPTIONS") or {}).get("prepare_threshold") is not None:
            errors.append(Warning(
                f"Database {alias!r} is behind PgBouncer in transaction pooling mode "
                f"(JOBGUARD['PGBOUNCER']) with OPTIONS['prepare_threshold'] set: psycopg "
                f"then prepares statements on one server connection and PgBouncer < 1.21 "
                f"runs them on another ('prepared statement \"_pg3_0\" does not exist').",
                hint=f"Remove DATABASES[{alias!r}]['OPTIONS']['prepare_threshold'] (Django's "
                     f"default: no prepared statements), or run PgBouncer >= 1.21 with "
                     f"max_prepared_statements > 0 and silence jobguard.W111. " + docs,
                id="jobguard.W111"))
    return errors


def _whole(value: Any) -> bool:
    """A whole number >= 1 (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _check_queues() -> list:
    """jobguard.E100–E108: ``QUEUES`` maps queue names to dicts of known keys, each
    ``global_concurrency`` and ``per_key_concurrency`` is a whole number of jobs >= 1,
    ``fair`` a bool and ``fair_weights`` a dict of fair keys to whole numbers >= 1."""
    from django_jobguard.queue_caps import QUEUE_KEYS

    errors: list = []
    hint = 'e.g. JOBGUARD["QUEUES"] = {"reports": {"global_concurrency": 2}}'
    for name, config in jobguard_settings.QUEUES.items():
        if not isinstance(name, str) or not name or name == "*" or not isinstance(config, dict):
            errors.append(Error(f"JOBGUARD['QUEUES'] must map queue names to dicts; "
                                f"{name!r}: {config!r} is not one.", hint=hint,
                                id="jobguard.E100"))
            continue
        for key in sorted(set(config) - QUEUE_KEYS):
            errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}] has an unknown key {key!r}.",
                                hint=f"Known keys: {', '.join(sorted(QUEUE_KEYS))}.",
                                id="jobguard.E101"))
        cap = config.get("global_concurrency")
        if not _whole_or_absent(config, "global_concurrency"):
            errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['global_concurrency'] must be "
                                f"a whole number of jobs >= 1, not {cap!r}.",
                                hint="Leave the key out for no cap; pause a queue with "
                                     "jobs_pause to run none.", id="jobguard.E102"))
        errors += _queue_objective_errors(name, config)
        errors += _check_fair_queue(name, config)
    return errors


def _whole_or_absent(config: dict, key: str) -> bool:
    """``config[key]`` is a whole number >= 1 (not a bool), or the key is left out."""
    value = config.get(key)
    return key not in config or (isinstance(value, int) and not isinstance(value, bool)
                                 and value >= 1)


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _queue_objective_errors(name: str, config: dict) -> list:
    """jobguard.E103-E105: a queue's ``max_wait`` (seconds > 0), ``max_failure_rate``
    (0 < rate < 1) and ``worker_concurrency`` (a whole number >= 1)."""
    errors: list = []
    wait = config.get("max_wait")
    if "max_wait" in config and not (_is_number(wait) and wait > 0):
        errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['max_wait'] must be a number of "
                            f"seconds > 0, not {wait!r}.",
                            hint="The longest the oldest waiting job may wait, e.g. 30.",
                            id="jobguard.E103"))
    rate = config.get("max_failure_rate")
    if "max_failure_rate" in config and not (_is_number(rate) and 0 < rate < 1):
        errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['max_failure_rate'] must be a "
                            f"fraction between 0 and 1 (exclusive), not {rate!r}.",
                            hint="e.g. 0.05 for 5% of the runs in SLO_WINDOW failing.",
                            id="jobguard.E104"))
    slots = config.get("worker_concurrency")
    if not _whole_or_absent(config, "worker_concurrency"):
        errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['worker_concurrency'] must be a "
                            f"whole number of job slots >= 1, not {slots!r}.",
                            hint="What one worker runs at once: jobworker --concurrency "
                                 "(or --threads).", id="jobguard.E105"))
    return errors


def _check_slo() -> list:
    """jobguard.E160: ``SLO_RECOVERY`` is not in (0, 1]; jobguard.E161: ``SLO_WEBHOOK`` is not
    an http(s) URL."""
    errors: list = []
    recovery = jobguard_settings.SLO_RECOVERY
    if not (_is_number(recovery) and 0 < recovery <= 1):
        errors.append(Error(f"JOBGUARD['SLO_RECOVERY'] must be a fraction > 0 and <= 1, not "
                            f"{recovery!r}.", hint="A breached objective recovers at this "
                            "fraction of its threshold; 0.8 by default.", id="jobguard.E160"))
    url = jobguard_settings.SLO_WEBHOOK
    if url is not None and not url.startswith(("http://", "https://")):
        errors.append(Error(f"JOBGUARD['SLO_WEBHOOK'] must be an http:// or https:// URL, not "
                            f"{url!r}.", hint="Or None for no webhook.", id="jobguard.E161"))
    return errors


def _check_fair_queue(name: str, config: dict) -> list:
    """jobguard.E106–E108: a queue's fair share keys (docs/scale-out.md)."""
    errors: list = []
    docs = "See docs/scale-out.md#fair-share-across-tenants."
    if "fair" in config and not isinstance(config["fair"], bool):
        errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['fair'] must be True or False, not "
                            f"{config['fair']!r}.", hint=docs, id="jobguard.E106"))
    weights = config.get("fair_weights")
    if "fair_weights" in config and (not isinstance(weights, dict) or not all(
            isinstance(key, str) and _whole(weight) for key, weight in weights.items())):
        errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['fair_weights'] must map fair keys "
                            f"(strings) to whole numbers >= 1 (rows per turn), not "
                            f"{weights!r}.", hint="e.g. {'tenant-42': 3}; a key left out has "
                            "weight 1. " + docs, id="jobguard.E107"))
    cap = config.get("per_key_concurrency")
    if "per_key_concurrency" in config and not _whole(cap):
        errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['per_key_concurrency'] must be a "
                            f"whole number of jobs >= 1, not {cap!r}.",
                            hint="Leave the key out for no per-key cap. " + docs,
                            id="jobguard.E108"))
    return errors


def _check_timeouts() -> list:
    from django_jobguard import registry

    retry_after = jobguard_settings.RETRY_AFTER
    errors: list[CheckMessage] = []
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
        elif timeout and hard_limit(timeout) >= retry_after:
            errors.append(Warning(
                f"{name} has timeout {timeout} s: a job stuck past it in C code that holds "
                f"the GIL cannot renew its lease, and JOBGUARD['RETRY_AFTER'] = {retry_after} "
                f"s runs out before the watchdog ends it at {hard_limit(timeout):g} s, so a "
                f"second worker could start a copy.",
                hint=f"Raise RETRY_AFTER above {hard_limit(timeout):g} (timeout + "
                     f"{hard_limit(0):g} s), or lower the timeout.",
                id="jobguard.W003",
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
        Error(f"JOBGUARD['API_DISPATCHABLE_JOBS'] names {name!r}, which is not a registered job."
              f"{registry.did_you_mean(name, rows=False)}",
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
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list:
    """jobguard.E060–E064, W050, W051: periodic schedules (``SCHEDULE`` and ``@periodic``)."""
    from django_jobguard import schedules

    if not isinstance(getattr(settings, "JOBGUARD", {}), dict):
        return []
    hint = "See docs/schedules.md for the entry format and the cron syntax."
    return [(Warning if check_id.startswith("jobguard.W") else Error)(message, hint=hint,
                                                                       id=check_id)
            for check_id, message in schedules.problems()]
