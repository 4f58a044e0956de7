"""System checks for ``JOBGUARD`` and the databases jobguard uses (``manage.py check``).

Ids:
- jobguard.E001 ``JOBGUARD`` is not a dict, or has an unknown key.
- jobguard.E002 a setting has the wrong type or range (as ``conf.SETTINGS`` declares it).
- jobguard.E003 ``RETRY_AFTER`` is not larger than a job's (or the default) ``timeout``.
- jobguard.W003 ``RETRY_AFTER`` is not larger than a timeout's hard limit (timeout + 6 s): a
  job stuck in C code past its timeout could be given to a second worker before the watchdog
  ends it.
- jobguard.E004 ``STORE`` names no entry in ``STORES``, or a store's ``BACKEND`` cannot load.
- jobguard.E005 ``API_DISPATCHABLE_JOBS`` names a job that is not registered.
- jobguard.E006 ``API_PERMISSION_CLASSES`` names a class that cannot be imported (checked when
  djangorestframework is installed).
- jobguard.E007 a job's ``middleware()`` uses ``RateLimited("name")`` for an undefined limiter.
- jobguard.E120 ``DATABASE`` names an alias that is not in ``DATABASES``.
- jobguard.E121 ``DATABASE`` is not ``"default"`` but the routers do not send the queue's models
  there (reads, writes and migrations): ``JobGuardRouter`` is missing from ``DATABASE_ROUTERS``
  or a router before it sends them elsewhere.
- jobguard.E040 ``UNKNOWN_JOB_GRACE`` is not a number of seconds >= 0.
- jobguard.E070 ``TEST_MODE`` is not ``""`` or ``"inline"``.
- jobguard.E060–E064 a periodic schedule cannot run: E060 bad cron expression, E061 unknown
  job, E062 unknown time zone, E063 bad ``catch_up``, E064 malformed entry or arguments.
- jobguard.W050 a schedule is declared both with ``@periodic`` and in ``SCHEDULE``.
- jobguard.W001 SQLite without ``"transaction_mode": "IMMEDIATE"``: concurrent workers may
  fail with "database is locked".
- jobguard.W002 a job uses ``WithoutOverlapping`` without ``expire_after``: a killed worker
  keeps the lock until it is force-released. Seen statically: ``@without_overlapping``
  options, and literal ``WithoutOverlapping(...)`` calls in a job's ``middleware()`` source.
- jobguard.E110 ``LISTEN_DATABASE`` is not a ``DATABASES`` alias; E111 it is not PostgreSQL.
- jobguard.E112 ``PGBOUNCER`` names an unknown or non-PostgreSQL alias, or ``LISTEN_DATABASE``.
- jobguard.W110 an alias behind PgBouncer without ``DISABLE_SERVER_SIDE_CURSORS``.
- jobguard.W111 an alias behind PgBouncer with ``OPTIONS["prepare_threshold"]`` (psycopg's
  server-side prepared statements break on PgBouncer < 1.21).
- jobguard.E100–E102 ``QUEUES`` is not a dict of queue names to known keys, or a
  ``global_concurrency`` is not a whole number >= 1.
- jobguard.E130 ``METRICS_TOKEN`` is shorter than 16 characters.
- jobguard.E140–E142, W140 a Redis store's topology (Cluster URLs, client-side sharding, a
  Sentinel cache set up half-way, fewer than 3 sentinels): ``stores/redis.py``,
  docs/scale-out.md.
- jobguard.E020 the queue's database has no ``SELECT ... FOR UPDATE SKIP LOCKED`` (MySQL < 8.0.1,
  MariaDB < 10.6): workers would wait on each other's claims. Tagged ``database`` (it asks the
  server its version): ``manage.py check --database default``, ``migrate`` and ``jobworker``
  run it.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections
from django.utils.module_loading import import_string

from django_jobguard.conf import DEFAULTS, SETTINGS, jobguard_settings
from django_jobguard.worker.timeouts import hard_limit


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
    for key, setting in SETTINGS.items():  # type and range, as conf.SETTINGS declares them
        problem = "" if setting.checked_by else setting.problem(getattr(jobguard_settings, key))
        if problem:
            errors.append(Error(f"JOBGUARD['{key}'] {problem}", id="jobguard.E002"))
    if errors:
        return errors
    return (errors + _check_timeouts() + _check_stores() + _check_dispatchable()
            + _check_api_permissions() + _check_limiters() + _check_reliability()
            + _check_test_mode() + _check_embedded_worker() + _check_pgbouncer()
            + _check_metrics_token() + _check_database()
            + _check_queues())


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


def _check_queues() -> list:
    """jobguard.E100–E102: ``QUEUES`` maps queue names to dicts of known keys, and each
    ``global_concurrency`` is a whole number of jobs >= 1."""
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
        if "global_concurrency" in config and (
                isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            errors.append(Error(f"JOBGUARD['QUEUES'][{name!r}]['global_concurrency'] must be "
                                f"a whole number of jobs >= 1, not {cap!r}.",
                                hint="Leave the key out for no cap; pause a queue with "
                                     "jobs_pause to run none.", id="jobguard.E102"))
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
        Error(f"JOBGUARD['API_DISPATCHABLE_JOBS'] names {name!r}, which is not a registered job.",
              hint="Use the job's registered name (module.ClassName or its `name`).",
              id="jobguard.E005")
        for name in jobguard_settings.API_DISPATCHABLE_JOBS if name not in known
    ]


def _check_limiters() -> list:
    """jobguard.E007: a registered job uses ``RateLimited("name")`` for an undefined limiter."""
    from django_jobguard import registry
    from django_jobguard.limits import rate_limiter

    errors = []
    for job_name, job_class in sorted(registry.all_jobs().items()):
        for name in sorted(referenced_limiters(job_class) - set(rate_limiter.names())):
            errors.append(Error(
                f"Job {job_name!r} uses RateLimited({name!r}), but no limiter {name!r} is "
                f"defined.",
                hint=f"Define it with @rate_limiter({name!r}) in <app>/jobs.py or a module in "
                     f"JOBGUARD['JOB_MODULES'], or fix the name.",
                id="jobguard.E007",
            ))
    return errors


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


@register(Tags.compatibility)
def check_overlap_expiry(app_configs: Any = None, **kwargs: Any) -> list:
    from django_jobguard import registry

    return [
        Warning(
            f"{name} uses WithoutOverlapping without expire_after: if a worker is killed while "
            f"running it (timeout, OOM, deploy), the lock stays until someone force-releases "
            f"it and every later {name} job on that key is deferred forever.",
            hint="Pass expire_after a little above the job's timeout, or expire_after with "
                 "renew=True; a stuck lock is released with manage.py jobs_locks --release KEY.",
            obj=job_class,
            id="jobguard.W002",
        )
        for name, job_class in sorted(registry.all_jobs().items())
        if has_unbounded_overlap(job_class)
    ]


# -- reading middleware from source (E007, W002) ----------------------------------------------
# Only calls written literally in a job's ``middleware()`` (or a ``@job`` middleware factory)
# are seen; anything built at run time is given the benefit of the doubt.


@dataclass(frozen=True)
class LiteralCall:
    """A call ``Callee(...)`` found in source: its first argument when that is a string
    literal, and its keyword arguments (``None`` when they cannot be known: ``**options``,
    or source that does not parse on its own, such as a lambda inside a decorator line)."""

    first: str | None
    keywords: dict[str | None, ast.expr] | None


_calls_cache: dict[tuple[Any, str], list[LiteralCall]] = {}


def literal_calls(function: Any, callee: str) -> list[LiteralCall]:
    """Calls of ``callee`` (a name or an attribute) in ``function``'s source."""
    cache_key = (function, callee)
    if cache_key not in _calls_cache:
        _calls_cache[cache_key] = _scan(function, callee)
    return _calls_cache[cache_key]


def _scan(function: Any, callee: str) -> list[LiteralCall]:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:  # e.g. a lambda inside a decorator line: its first string only
        pattern = re.compile(rf"""\b{re.escape(callee)}\(\s*(["'])([^"']+)\1""")
        return [LiteralCall(first=m.group(2), keywords=None) for m in pattern.finditer(source)]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name != callee:
            continue
        first = node.args[0] if node.args else None
        keywords = {kw.arg: kw.value for kw in node.keywords}
        found.append(LiteralCall(
            first=first.value if isinstance(first, ast.Constant)
            and isinstance(first.value, str) else None,
            keywords=None if None in keywords else keywords))
    return found


def _middleware_sources(job_class: type) -> list[Any]:
    """The functions whose source may build a job's middleware."""
    from django_jobguard.decorators import FunctionJob
    from django_jobguard.jobs import Job

    method = getattr(job_class, "middleware", None)
    function = getattr(method, "__func__", method)
    own = [] if function in (Job.middleware, FunctionJob.middleware, None) else [function]
    return own + list(getattr(job_class, "middleware_factories", None) or ())


def referenced_limiters(job_class: type) -> set[str]:
    """Limiter names a job passes to ``RateLimited("…")`` as string literals."""
    return {call.first for source in _middleware_sources(job_class)
            for call in literal_calls(source, "RateLimited") if call.first}


def has_unbounded_overlap(job_class: type) -> bool:
    """True when ``job_class`` (as far as can be told without running it) uses
    ``WithoutOverlapping`` with no ``expire_after`` (or a literal 0)."""
    from django_jobguard.decorators import OverlapFactory

    for source in _middleware_sources(job_class):
        if isinstance(source, OverlapFactory):
            if not source.expire_after:
                return True
            continue
        for call in literal_calls(source, "WithoutOverlapping"):
            if call.keywords is None:
                continue
            value = call.keywords.get("expire_after")
            if value is None or (isinstance(value, ast.Constant) and not value.value):
                return True
    return False


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
