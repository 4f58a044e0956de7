"""Settings for the test project and the demo.

SQLite by default. Environment variables switch services on:
- ``JOBGUARD_TEST_DATABASE_URL=postgres://127.0.0.1/test`` (or ``mysql://root@127.0.0.1/test``)
- ``JOBGUARD_REDIS_URL=redis://127.0.0.1:6379/0`` (django-redis cache "default"; the Redis store)
- ``JOBGUARD_STORE=redis`` makes the Redis store the default store.
- ``JOBGUARD_DB_NAME`` points worker subprocesses started by tests at the test database.
"""

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "jobguard-testproject-not-secret"
DEBUG = os.environ.get("JOBGUARD_DEBUG", "") == "1"
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "testproject.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobguard",
    "demo",
]
try:
    import rest_framework  # noqa: F401

    INSTALLED_APPS += ["rest_framework"]
except ImportError:
    pass

# django.tasks (Django >= 6.0) or its backport (django-jobguard[tasks] on Django 5.2): @task
# functions run on jobguard's queue. Without either, the project runs without TASKS.
try:
    import django.tasks  # noqa: F401
    HAS_TASKS = True
except ImportError:
    try:
        import django_tasks  # noqa: F401
    except ImportError:
        HAS_TASKS = False
    else:
        HAS_TASKS = True
        INSTALLED_APPS += ["django_tasks"]
if HAS_TASKS:
    TASKS = {"default": {"BACKEND": "django_jobguard.tasks_backend.JobGuardBackend",
                         "QUEUES": ["default", "tasks"]}}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]


def database_from_url(url: str) -> dict:
    parts = urlparse(url)
    engine = {"postgres": "postgresql", "postgresql": "postgresql", "mysql": "mysql",
              "mariadb": "mysql"}[parts.scheme]
    config: dict[str, Any] = {
        "ENGINE": f"django.db.backends.{engine}",
        "NAME": unquote(parts.path.lstrip("/")) or "test",
        "USER": unquote(parts.username or ("postgres" if engine == "postgresql" else "root")),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or ""),
    }
    if engine == "mysql":
        config["OPTIONS"] = {"charset": "utf8mb4"}
    return config


DATABASE_URL = os.environ.get("JOBGUARD_TEST_DATABASE_URL", "")
if DATABASE_URL:
    default_db = database_from_url(DATABASE_URL)
else:
    default_db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("JOBGUARD_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
        # IMMEDIATE transactions and a busy timeout let several workers share one file.
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30,
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        "TEST": {"NAME": str(BASE_DIR / f".test-{os.getpid()}.sqlite3")},
    }
if os.environ.get("JOBGUARD_DB_NAME"):  # a worker subprocess started by the tests
    default_db["NAME"] = os.environ["JOBGUARD_DB_NAME"]
DATABASES = {"default": default_db}

REDIS_URL = os.environ.get("JOBGUARD_REDIS_URL", "")
if REDIS_URL:
    CACHES = {"default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("JOBGUARD_REDIS_PREFIX", "jgtest"),
    }}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

JOBGUARD = {
    "STORE": os.environ.get("JOBGUARD_STORE", "database"),
    "RETRY_AFTER": float(os.environ.get("JOBGUARD_RETRY_AFTER", "90")),
    "DEFAULT_TIMEOUT": float(os.environ.get("JOBGUARD_DEFAULT_TIMEOUT", "60")),
    "MAX_PAYLOAD_BYTES": int(os.environ.get("JOBGUARD_MAX_PAYLOAD_BYTES", "1048576")),
    "JOB_MODULES": [m for m in os.environ.get("JOBGUARD_EXTRA_JOB_MODULES", "").split(",") if m],
    "API_DISPATCHABLE_JOBS": ["demo.jobs.SyncProfile", "demo.jobs.send_welcome_email"],
    # e.g. '{"reports": {"global_concurrency": 2}}' (tests of the global per-queue cap).
    "QUEUES": json.loads(os.environ.get("JOBGUARD_QUEUES", "{}")),
    # "off", "failures" or "all" (tests of the finished-job history).
    "HISTORY": os.environ.get("JOBGUARD_HISTORY", "off"),
    # Batched completion (PostgreSQL), e.g. 0.005: its kill tests set it for their workers.
    "COMPLETION_WINDOW": float(os.environ.get("JOBGUARD_COMPLETION_WINDOW", "0")),
    # The URL the queue objectives' webhook posts to (tests of django_jobguard.slo).
    "SLO_WEBHOOK": os.environ.get("JOBGUARD_SLO_WEBHOOK") or None,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # The audit log (django_jobguard.operations: "Cancelled 3 queued job(s) by ...") is not
    # echoed on the console in the middle of the demo's and the commands' own output; a site
    # routes it to a file or its log service (docs/operate.md#the-audit-log).
    "filters": {"no_audit": {
        "()": "django.utils.log.CallbackFilter",
        "callback": lambda record: record.name != "django_jobguard.operations"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["no_audit"]}},
    "loggers": {"django_jobguard": {"handlers": ["console"],
                                    "level": os.environ.get("JOBGUARD_LOG_LEVEL", "WARNING")}},
}
