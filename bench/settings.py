"""Django settings for the benchmarks: one database shared by jobguard and its peers.

``JOBGUARD_BENCH_DATABASE_URL`` (default ``postgres://127.0.0.1:5432/jobguard_bench``; a
``mysql://`` URL runs the scenarios that need no PostgreSQL on MariaDB, see bench/run.py) and
``JOBGUARD_BENCH_REDIS_URL`` (celery's broker, default ``redis://127.0.0.1:6379/0``).
"""

import importlib.util
import json
import os

import django
from testproject.settings import database_from_url

SECRET_KEY = "jobguard-bench-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASE_URL = os.environ.get("JOBGUARD_BENCH_DATABASE_URL",
                              "postgres://127.0.0.1:5432/jobguard_bench")
REDIS_URL = os.environ.get("JOBGUARD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASES = {"default": database_from_url(DATABASE_URL)}
# Persistent connections, as a deployed worker has them. With Django's default (0) a worker
# that calls close_old_connections() between tasks, as django-tasks-db's db_worker does,
# opens a new connection for every poll and every task: that measured the connection set-up,
# not the queue. jobguard's worker keeps its connection either way.
DATABASES["default"]["CONN_MAX_AGE"] = None
# Prepared statements for jobguard's claim/ack (Django turns them off by default for poolers).
if (DATABASES["default"]["ENGINE"].endswith("postgresql")
        and os.environ.get("JOBGUARD_BENCH_PREPARE", "1") == "1"):
    DATABASES["default"]["OPTIONS"] = {"prepare_threshold": 5}

INSTALLED_APPS = ["django.contrib.contenttypes", "django_jobguard", "bench"]
# Peers are optional (pip install -e '.[bench]'); a scenario skips the ones not installed.
if importlib.util.find_spec("django_tasks_db"):
    if django.VERSION < (6, 0):  # the django-tasks backport; Django 6 has django.tasks
        INSTALLED_APPS += ["django_tasks"]
    INSTALLED_APPS += ["django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

JOBGUARD = {
    "USE_NOTIFY": os.environ.get("JOBGUARD_BENCH_NOTIFY", "1") == "1",
    # Unset: the default, adaptive claim (--batch N overrides it per worker).
    "CLAIM_BATCH_SIZE": int(os.environ["JOBGUARD_BENCH_BATCH"])
    if os.environ.get("JOBGUARD_BENCH_BATCH") else None,
    # Unset: the default (acks commit without waiting for the WAL flush); "1" waits.
    "SYNCHRONOUS_ACKS": os.environ.get("JOBGUARD_BENCH_SYNCHRONOUS_ACKS", "0") == "1",
    # The finished-job history (bench/history.py compares "off" and "all").
    "HISTORY": os.environ.get("JOBGUARD_BENCH_HISTORY", "off"),
    # Batched completion (bench/peers.py and bench/throughput.py compare 0 with 0.005).
    "COMPLETION_WINDOW": float(os.environ.get("JOBGUARD_BENCH_COMPLETION_WINDOW", "0")),
    "COMPLETION_BATCH_SIZE": int(os.environ.get("JOBGUARD_BENCH_COMPLETION_BATCH", "500")),
    "RETRY_AFTER": float(os.environ.get("JOBGUARD_BENCH_RETRY_AFTER", "90")),
    "DEFAULT_TIMEOUT": float(os.environ.get("JOBGUARD_BENCH_DEFAULT_TIMEOUT", "60")),
    # Per-queue settings as JSON (bench/fairness.py makes the queue fair with them).
    "QUEUES": json.loads(os.environ.get("JOBGUARD_BENCH_QUEUES", "{}")),
}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "root": {"level": "WARNING", "handlers": []}}
