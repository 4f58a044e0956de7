"""System checks for ``JOBGUARD`` and the databases jobguard uses (``manage.py check``).

Importing this package registers them all (``apps.py`` does, in ``ready()``): ``settings.py``
checks the ``JOBGUARD`` setting and the schedules, ``sources.py`` reads the middleware a job's
source builds (E007, W002), ``databases.py`` asks the databases themselves (W001, E020, W020).

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
- jobguard.E103–E105 a queue's ``max_wait`` is not seconds > 0, its ``max_failure_rate`` not a
  fraction in (0, 1), its ``worker_concurrency`` not a whole number >= 1.
- jobguard.E160 ``SLO_RECOVERY`` is not in (0, 1]; E161 ``SLO_WEBHOOK`` is not an http(s) URL.
- jobguard.E106–E108 a queue's fair share: ``fair`` is not a bool, ``fair_weights`` is not a
  dict of keys to whole numbers >= 1, ``per_key_concurrency`` is not a whole number >= 1.
- jobguard.E130 ``METRICS_TOKEN`` is shorter than 16 characters.
- jobguard.E140–E142, W140 a Redis store's topology (Cluster URLs, client-side sharding, a
  Sentinel cache set up half-way, fewer than 3 sentinels): ``stores/redis.py``,
  docs/scale-out.md.
- jobguard.E150 ``HISTORY`` is not ``"off"``, ``"failures"`` or ``"all"``.
- jobguard.E020 the queue's database has no ``SELECT ... FOR UPDATE SKIP LOCKED`` (MySQL < 8.0.1,
  MariaDB < 10.6): workers would wait on each other's claims. Tagged ``database`` (it asks the
  server its version): ``manage.py check --database default``, ``migrate`` and ``jobworker``
  run it.
- jobguard.W020 jobguard's migrations are not (all) applied to the queue's database: run
  ``manage.py migrate``. Tagged ``database`` (a warning, so that ``migrate`` itself runs; not
  shown by ``migrate``).
"""

from django_jobguard.checks.databases import check_migrated, check_skip_locked, check_sqlite_mode
from django_jobguard.checks.settings import TEST_MODES, check_schedules, check_settings
from django_jobguard.checks.sources import (
    LiteralCall,
    check_overlap_expiry,
    has_unbounded_overlap,
    literal_calls,
    referenced_limiters,
)

__all__ = [
    "TEST_MODES", "LiteralCall", "check_migrated", "check_overlap_expiry", "check_schedules",
    "check_settings",
    "check_skip_locked", "check_sqlite_mode", "has_unbounded_overlap", "literal_calls",
    "referenced_limiters",
]
