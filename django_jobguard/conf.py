"""The ``JOBGUARD`` setting: one dict, reloaded when tests override it.

Each key is declared once in :data:`SETTINGS` (default, accepted types and range, a doc line);
:data:`DEFAULTS` and the type and range check (``jobguard.E002`` in checks/settings.py) derive
from it. Modelled on DRF's ``api_settings``: ``jobguard_settings.RETRY_AFTER`` reads the user's
value or the default, and ``override_settings(JOBGUARD=...)`` takes effect at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

_NONE = type(None)


@dataclass(frozen=True)
class Setting:
    """One key of ``JOBGUARD``: its default, the types and range it accepts, and what it does.

    ``check_settings`` (jobguard.E002) checks every key against its declaration, except those
    with ``checked_by``: a check of their own (its id) checks them, with a message of its own.
    """

    name: str
    default: Any
    #: The accepted types (``bool`` only when listed: ``True`` is no ``int`` here).
    types: tuple[type, ...]
    #: What it does, in one line (docs/settings.md says more).
    doc: str
    #: The value must be greater than this (``None`` passes: it means "off" or "adaptive").
    above: float | None = None
    #: The value must be at least this.
    at_least: float | None = None
    #: The id of the check that checks this key instead of jobguard.E002.
    checked_by: str = ""

    @property
    def accepts(self) -> str:
        """The types and range in words, as docs/settings.md's table shows them."""
        text = " or ".join(t.__name__ for t in self.types if t is not _NONE)
        if self.above is not None:
            text += f" > {self.above:g}"
        if self.at_least is not None:
            text += f" >= {self.at_least:g}"
        return text + (", or None" if _NONE in self.types else "")

    def problem(self, value: Any) -> str:
        """Why ``value`` is not accepted (``"must be int, not str."``), or ``""``."""
        if not isinstance(value, self.types) or (isinstance(value, bool)
                                                 and bool not in self.types):
            expected = " or ".join("None" if t is _NONE else t.__name__ for t in self.types)
            return f"must be {expected}, not {type(value).__name__}."
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return ""
        if self.above is not None and not value > self.above:
            return f"must be greater than {self.above:g}."
        if self.at_least is not None and not value >= self.at_least:
            return ("must not be negative." if self.at_least == 0
                    else f"must be at least {self.at_least:g}.")
        return ""


#: Every key of ``JOBGUARD``, declared once; docs/settings.md lists them in this order (a test
#: holds it to their names, defaults and ranges).
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("DEFAULT_QUEUE", "default", (str,), "Queue name used when a job does not set one."),
    Setting("RETRY_AFTER", 90, (int, float),
            "Seconds a reserved job stays invisible before another worker may take it (crash "
            "recovery); workers extend it while a job runs, so only a dead worker's job comes "
            "back.", above=0),
    Setting("DEFAULT_TIMEOUT", 60, (int, float),
            "Worker default for jobs without their own ``timeout`` (seconds, 0 = none).",
            at_least=0),
    Setting("CLAIM_BATCH_SIZE", None, (int, _NONE),
            "How many jobs a worker reserves in one claim query; None: adaptive (one without "
            "a backlog, up to 512 with one; see claiming.py).", above=0),
    Setting("MAX_PAYLOAD_BYTES", 1_048_576, (int,),
            "Largest accepted JSON payload in bytes (dispatch raises ValueError above it; "
            "0 = no limit).", at_least=0),
    Setting("MAX_RESULT_BYTES", 1_048_576, (int,),
            "Largest return value a kept result stores, in bytes of its JSON (0 = no limit); "
            "a larger one is replaced by a note giving its size and this limit, and the job "
            "still succeeds.", at_least=0),
    Setting("JOB_MODULES", [], (list, tuple),
            "Extra modules to import at start-up so their jobs register (``<app>.jobs`` is "
            "automatic)."),
    Setting("CONTEXT_CARRIERS", ["django_jobguard.carriers.Language",
                                 "django_jobguard.carriers.CorrelationId",
                                 "django_jobguard.carriers.Tenant"], (list, tuple),
            "Context carriers (dotted paths): what each captures at dispatch is restored "
            "around the job's run."),
    Setting("USE_NOTIFY", True, (bool,),
            "PostgreSQL: wake idle workers with LISTEN/NOTIFY instead of waiting for --sleep."),
    Setting("SYNCHRONOUS_ACKS", False, (bool,),
            "PostgreSQL: False lets a worker's ack (and the start of a row claimed ahead) "
            "commit without waiting for the WAL flush (one fsync per job); a database crash "
            "may then forget its last fraction of a second of acks, and those jobs run again "
            "after their lease (at-least-once). True waits, as other commits do."),
    Setting("COMPLETION_WINDOW", 0.0, (int, float),
            "PostgreSQL: seconds a finished job's ack may wait to be written with others in "
            "one statement (batched completion; 0 = one ack per job). A worker killed loses at "
            "most the acks of this window: those jobs run again, without using a try "
            "(docs/guarantees.md). 0.005 is a good value for many short jobs.", at_least=0),
    Setting("COMPLETION_BATCH_SIZE", 500, (int,),
            "With COMPLETION_WINDOW: a group of acks is written at once when this many jobs "
            "finished.", above=0),
    Setting("DATABASE", "default", (str,),
            "Database alias holding the queue's tables (every django_jobguard model). Another "
            "alias than 'default' needs django_jobguard.routers.JobGuardRouter in "
            "DATABASE_ROUTERS; dispatch is then not part of the caller's transaction unless "
            "on_commit=True (docs/databases.md)."),
    Setting("LISTEN_DATABASE", None, (str, _NONE),
            "A DATABASES alias with a direct (session) connection to the queue's PostgreSQL "
            "database, used only for LISTEN; None: LISTEN on the queue's own database. Needed "
            "behind a transaction-pooling PgBouncer, where a LISTEN never hears a NOTIFY."),
    Setting("PGBOUNCER", False, (bool, list, tuple),
            "The PostgreSQL aliases reached through PgBouncer in transaction pooling mode: "
            "True (all but LISTEN_DATABASE), or a list of aliases. Workers then never LISTEN "
            "through them, and checks W110/W111 ask for the settings pooling needs."),
    Setting("STORE", "database", (str,),
            "The lock/counter store used unless a job names another (``unique_via`` and "
            "friends)."),
    Setting("STORES", {
        "database": {"BACKEND": "django_jobguard.stores.database.DatabaseStore"},
        "redis": {"BACKEND": "django_jobguard.stores.redis.RedisStore", "CACHE": "default"},
    }, (dict,),
            "Named stores, like CACHES: ``BACKEND`` is a dotted path, other keys go to its "
            "constructor; merged over the built-in 'database' and 'redis'."),
    Setting("DEFERRALS_CONSUME_ATTEMPTS", False, (bool,),
            "Laravel counts a release by WithoutOverlapping/RateLimited/an open circuit as an "
            "attempt, so ``tries`` runs out before the job ever runs; jobguard does not, unless "
            "this is True."),
    Setting("API_DISPATCHABLE_JOBS", [], (list, tuple),
            "Job names that the HTTP dispatch endpoint accepts (none by default)."),
    Setting("API_PERMISSION_CLASSES",
            ["django_jobguard.api.permissions.JobGuardAdminPermissions"], (list, tuple),
            "DRF permission classes (dotted paths) guarding the API; the default asks what the "
            "admin asks: staff status and the model permission."),
    Setting("RESULT_RETENTION_DAYS", 7, (int, float),
            "Days to keep finished django.tasks results before they are pruned (0 = keep "
            "them).", at_least=0),
    Setting("FAILED_RETENTION_DAYS", None, (int, float, _NONE),
            "Days to keep failed jobs before the workers' housekeeping deletes them; None keeps "
            "them until someone retries, forgets or flushes them (Laravel keeps them too).",
            above=0),
    Setting("HISTORY", "off", (str,),
            "Which finished runs to keep as history (FinishedRun rows): 'off', 'failures' or "
            "'all'; buffered by each worker and inserted together at its heartbeat.",
            checked_by="jobguard.E150"),
    Setting("HISTORY_RETENTION_DAYS", 7, (int, float),
            "Days to keep finished runs (HISTORY) before the workers' housekeeping deletes "
            "them, in batches of 1,000 per round.", above=0),
    Setting("UNKNOWN_JOB_GRACE", 600, (int, float),
            "Seconds after it was queued that a job whose name this worker does not know is "
            "put back (with back-off) for a newer worker to take, as in a rolling deploy; then "
            "it is failed.", at_least=0, checked_by="jobguard.E040"),
    Setting("TEST_MODE", "", (str,),
            "Tests only: 'inline' runs every dispatch at once in the dispatching process, "
            "through the worker's pipeline; '' (the default) queues jobs for workers (E070)."),
    Setting("SCHEDULE", {}, (dict,),
            "Periodic jobs by name: {'nightly': {'job': 'app.jobs.Nightly', 'cron': "
            "'0 3 * * *', ...}} (docs/schedules.md; E060-E064)."),
    Setting("ASYNC_BLOCKED_AFTER", 1.0, (int, float),
            "Seconds the worker's event loop may go without answering (an async job blocking "
            "it) before the worker logs a warning naming the job; 0: no probe.", at_least=0),
    Setting("ASYNC_CONCURRENCY", 10, (int,),
            "Async jobs one worker process runs at once on its event loop (jobworker "
            "--async-concurrency overrides it).", above=0),
    Setting("EMBEDDED_WORKER", None, (dict, _NONE),
            "Worker threads inside the web server's process (small apps, development): None "
            "(off) or {'threads': 2, 'queues': ['*'], 'sleep': 3, 'shutdown_timeout': 20, "
            "'tries': 1} (E080)."),
    Setting("ADMIN_REFRESH_SECONDS", 10, (int, float),
            "Seconds between two polls of the admin's live pages (the dashboard, the lists, "
            "locks and throttles refresh themselves; a toggle pauses them); 0: no live "
            "updates.", at_least=0),
    Setting("METRICS_TOKEN", None, (str, _NONE),
            "The bearer token Prometheus sends to the metrics view; None: only logged-in staff "
            "with the view permission may read it (E130: at least 16 characters)."),
    Setting("QUEUES", {}, (dict,),
            "Settings per queue name: {'reports': {'global_concurrency': 2}} runs at most two "
            "jobs of 'reports' at once across every worker and host (E100-E102); 'max_wait' "
            "(seconds the oldest waiting job may wait) and 'max_failure_rate' (0-1) are the "
            "queue's objectives, 'worker_concurrency' the job slots per worker the "
            "recommended worker count divides by (E103-E105; docs/operate.md); 'fair': True "
            "claims its rows in round robin over their fair_key, 'fair_weights': {key: n} "
            "gives a key n rows per turn, 'per_key_concurrency': n reserves at most n rows "
            "per key at once (docs/scale-out.md; E106-E108)."),
    Setting("SLO_WINDOW", 300, (int, float),
            "Seconds of recent history a queue's failure rate, throughput and mean runtime "
            "are measured over (rounded up to whole minutes).", at_least=60),
    Setting("SLO_MIN_RUNS", 10, (int,),
            "Runs a queue must have finished in SLO_WINDOW before its failure rate can breach "
            "max_failure_rate (fewer are too few to judge).", at_least=1),
    Setting("SLO_RECOVERY", 0.8, (int, float),
            "Hysteresis: a breached objective recovers when its value falls to this fraction "
            "of the threshold or below (0 < SLO_RECOVERY <= 1; E160).",
            checked_by="jobguard.E160"),
    Setting("SLO_WEBHOOK", None, (str, _NONE),
            "A URL that gets a JSON POST when a queue's objective is breached or recovers "
            "(once per crossing, from a background thread; failures are logged; E161)."),
    Setting("SLO_WEBHOOK_TIMEOUT", 5.0, (int, float),
            "Seconds the SLO webhook's POST may take before it is given up (and logged).",
            above=0),
)}

#: Each key's default (derived from :data:`SETTINGS`).
DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}


class JobGuardSettings:
    """Attribute access to ``settings.JOBGUARD`` merged over :data:`DEFAULTS`."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(settings, "JOBGUARD", {})
        return value if isinstance(value, dict) else {}

    def __getattr__(self, name: str) -> Any:
        """A setting read the first time since the last :meth:`reload`; it is then kept as
        an attribute of this object, which later reads find without calling this."""
        if name not in DEFAULTS:
            raise AttributeError(f"Invalid JOBGUARD setting: {name!r}")
        if self._cache is None:
            merged = dict(DEFAULTS)
            merged.update(self.user_settings)
            if "STORES" in self.user_settings and isinstance(self.user_settings["STORES"], dict):
                merged["STORES"] = {**DEFAULTS["STORES"], **self.user_settings["STORES"]}
            self._cache = merged
        value = self.__dict__[name] = self._cache[name]
        return value

    def reload(self) -> None:
        self._cache = None
        for name in DEFAULTS:
            self.__dict__.pop(name, None)


jobguard_settings = JobGuardSettings()


def queue_database(using: str | None = None) -> str:
    """``using`` if given, else the alias holding the queue (``JOBGUARD['DATABASE']``): every
    ``using=None`` in jobguard resolves here, when called, so ``override_settings`` works."""
    return using or jobguard_settings.DATABASE


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBGUARD":
        jobguard_settings.reload()


setting_changed.connect(_reload)
