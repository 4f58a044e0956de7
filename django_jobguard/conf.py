"""The ``JOBGUARD`` setting: one dict, defaults here, reloaded when tests override it.

Modelled on DRF's ``api_settings``: ``jobguard_settings.RETRY_AFTER`` reads the user's value or
the default, and ``override_settings(JOBGUARD=...)`` takes effect at once.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    # Queue name used when a job does not set one.
    "DEFAULT_QUEUE": "default",
    # Seconds a reserved job stays invisible before another worker may take it (crash recovery).
    # Workers extend the reservation while a job runs, so only a dead worker's job comes back.
    "RETRY_AFTER": 90,
    # Worker default for jobs without their own ``timeout`` (seconds, 0 = none).
    "DEFAULT_TIMEOUT": 60,
    # How many jobs a worker reserves in one claim query; None: adaptive (one without a
    # backlog, up to 16 with one; see claiming.py).
    "CLAIM_BATCH_SIZE": None,
    # Largest accepted JSON payload in bytes (dispatch raises ValueError above it).
    "MAX_PAYLOAD_BYTES": 1_048_576,
    # Largest return value a kept result stores, in bytes of its JSON (int >= 0; 0 = no
    # limit). A larger one is replaced by a note giving its size and this limit; the job still
    # succeeds.
    "MAX_RESULT_BYTES": 1_048_576,
    # Extra modules to import at start-up so their jobs register (``<app>.jobs`` is automatic).
    "JOB_MODULES": [],
    # PostgreSQL: wake idle workers with LISTEN/NOTIFY instead of waiting for ``--sleep``.
    "USE_NOTIFY": True,
    # PostgreSQL: False lets a worker's ack (and the start of a row claimed ahead) commit
    # without waiting for the WAL flush (one fsync per job); a database crash may then forget
    # its last fraction of a second of acks, and those jobs run again after their lease
    # (at-least-once). True waits, as other commits do.
    "SYNCHRONOUS_ACKS": False,
    # Database alias holding the queue's tables (every django_jobguard model). Another alias
    # than "default" needs django_jobguard.routers.JobGuardRouter in DATABASE_ROUTERS; dispatch
    # is then not part of the caller's transaction unless on_commit=True (docs/databases.md).
    "DATABASE": "default",
    # A DATABASES alias with a direct (session) connection to the queue's PostgreSQL database,
    # used only for LISTEN; None: LISTEN on the queue's own database. Needed behind a
    # transaction-pooling PgBouncer, where a LISTEN never hears a NOTIFY (docs/databases.md).
    "LISTEN_DATABASE": None,
    # The PostgreSQL aliases reached through PgBouncer in transaction pooling mode: True (all
    # but LISTEN_DATABASE), or a list of aliases. Workers then never LISTEN through them, and
    # system checks ask for the settings transaction pooling needs (W110, W111).
    "PGBOUNCER": False,
    # The lock/counter store used unless a job names another (``unique_via`` and friends).
    "STORE": "database",
    # Named stores, like CACHES. ``BACKEND`` is a dotted path; other keys go to its constructor.
    "STORES": {
        "database": {"BACKEND": "django_jobguard.stores.database.DatabaseStore"},
        "redis": {"BACKEND": "django_jobguard.stores.redis.RedisStore", "CACHE": "default"},
    },
    # Laravel counts a release by WithoutOverlapping/RateLimited/an open circuit as an attempt,
    # so ``tries`` runs out before the job ever runs. jobguard does not, unless this is True.
    "DEFERRALS_CONSUME_ATTEMPTS": False,
    # Job names that the HTTP dispatch endpoint accepts (nothing is dispatchable by default).
    "API_DISPATCHABLE_JOBS": [],
    # DRF permission classes (dotted paths) guarding the API; the default asks what the admin
    # asks: staff status and the model permission (view for reads, change/delete/add for actions).
    "API_PERMISSION_CLASSES": ["django_jobguard.api.permissions.JobGuardAdminPermissions"],
    # Days to keep finished django.tasks results before ``jobs_prune_results`` removes them.
    "RESULT_RETENTION_DAYS": 7,
    # Days to keep failed jobs before the workers' housekeeping deletes them; None keeps them
    # until someone retries, forgets or flushes them (Laravel keeps them too).
    "FAILED_RETENTION_DAYS": None,
    # Seconds after it was queued that a job whose name this worker does not know is put back
    # (with back-off) for a newer worker to take, as in a rolling deploy; then it is failed.
    "UNKNOWN_JOB_GRACE": 600,
    # Tests only: "inline" runs every dispatch at once in the dispatching process, through the
    # worker's pipeline (docs/testing.md). "" (the default) queues jobs for workers.
    "TEST_MODE": "",
    # Periodic jobs by name: {"nightly": {"job": "app.jobs.Nightly", "cron": "0 3 * * *",
    # "args": [], "kwargs": {}, "timezone": "UTC", "catch_up": "last", "queue": None}}.
    "SCHEDULE": {},
    # Seconds the worker's event loop may go without answering (an async job blocking it with
    # time.sleep() or sync I/O) before the worker logs a warning naming the job; 0: no probe.
    "ASYNC_BLOCKED_AFTER": 1.0,
    # Async jobs one worker process runs at once on its event loop (jobworker
    # --async-concurrency overrides it).
    "ASYNC_CONCURRENCY": 10,
    # Worker threads inside the web server's process (small apps, development): None (off) or
    # {"threads": 2, "queues": ["*"], "sleep": 3, "shutdown_timeout": 20, "tries": 1}.
    "EMBEDDED_WORKER": None,
    # The bearer token Prometheus sends to the metrics view (django_jobguard.metrics.urls);
    # None: only logged-in staff with the view permission may read it.
    "METRICS_TOKEN": None,
    # Settings per queue name: {"reports": {"global_concurrency": 2}} runs at most two jobs of
    # "reports" at once across every worker and host (enforced in the database at each claim).
    "QUEUES": {},
}


class JobGuardSettings:
    """Attribute access to ``settings.JOBGUARD`` merged over :data:`DEFAULTS`."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(settings, "JOBGUARD", {})
        return value if isinstance(value, dict) else {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Invalid JOBGUARD setting: {name!r}")
        if self._cache is None:
            merged = dict(DEFAULTS)
            merged.update(self.user_settings)
            if "STORES" in self.user_settings and isinstance(self.user_settings["STORES"], dict):
                merged["STORES"] = {**DEFAULTS["STORES"], **self.user_settings["STORES"]}
            self._cache = merged
        return self._cache[name]

    def reload(self) -> None:
        self._cache = None


jobguard_settings = JobGuardSettings()


def queue_database(using: str | None = None) -> str:
    """``using`` if given, else the alias holding the queue (``JOBGUARD['DATABASE']``): every
    ``using=None`` in jobguard resolves here, when called, so ``override_settings`` works."""
    return using or jobguard_settings.DATABASE


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBGUARD":
        jobguard_settings.reload()


setting_changed.connect(_reload)
