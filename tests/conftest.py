"""Shared fixtures. The database comes from the environment (see testproject/settings.py):
SQLite by default, PostgreSQL with JOBGUARD_TEST_DATABASE_URL; the Redis store with
JOBGUARD_REDIS_URL. Multi-process tests start real ``manage.py jobworker`` processes against
the test database through :func:`workers`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from django_jobguard import stores
from django_jobguard.conf import jobguard_settings

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"
REDIS_URL = os.environ.get("JOBGUARD_REDIS_URL", "")
POSTGRES = os.environ.get("JOBGUARD_TEST_DATABASE_URL", "").startswith("postgres")

requires_postgres = pytest.mark.skipif(
    not POSTGRES, reason="needs PostgreSQL: set JOBGUARD_TEST_DATABASE_URL=postgres://...")
requires_redis = pytest.mark.skipif(
    not REDIS_URL, reason="needs Redis: set JOBGUARD_REDIS_URL=redis://127.0.0.1:6379/0")


def pytest_report_header(config):
    return (f"jobguard: database={os.environ.get('JOBGUARD_TEST_DATABASE_URL') or 'sqlite'} "
            f"redis={REDIS_URL or 'off'}")


@pytest.fixture(autouse=True)
def _fresh_stores():
    stores.reset()
    yield
    stores.reset()


@pytest.fixture
def released() -> Iterator[list[dict]]:
    """The keyword arguments of every ``job_released`` signal sent during the test."""
    from django_jobguard import signals

    seen: list[dict] = []

    def receiver(**kwargs):
        seen.append(kwargs)

    signals.job_released.connect(receiver)
    yield seen
    signals.job_released.disconnect(receiver)


@pytest.fixture(params=["database", pytest.param("redis", marks=requires_redis)])
def store_alias(request) -> Iterator[str]:
    """Run the test once per store; the chosen store is also JOBGUARD['STORE']."""
    alias = request.param
    with override_settings(JOBGUARD={**_user_settings(), "STORE": alias}):
        if alias == "redis":
            _flush_redis()
        yield alias
        if alias == "redis":
            _flush_redis()


def _user_settings() -> dict:
    return dict(jobguard_settings.user_settings)


def _flush_redis() -> None:
    client = stores.get_store("redis").client
    for key in client.scan_iter(match="jobguard:*", count=1000):
        client.delete(key)


def worker_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess that must use this test run's database and store."""
    env = dict(os.environ)
    env["JOBGUARD_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["JOBGUARD_STORE"] = jobguard_settings.STORE
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class WorkerPool:
    """Real ``jobworker`` processes; ``wait()`` returns their outputs once they exit."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs

    def wait(self, timeout: float = 120) -> list[str]:
        deadline = time.monotonic() + timeout
        outputs = []
        for proc in self.procs:
            try:
                out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"worker {proc.pid} did not exit within {timeout} s")
            outputs.append(out)
        codes = [p.returncode for p in self.procs]
        assert all(code == 0 for code in codes), f"worker exit codes {codes}:\n" + "\n".join(
            o[-3000:] for o in outputs)
        return outputs

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def start_workers(n: int, *args: str, env: dict[str, str] | None = None) -> WorkerPool:
    """Start ``n`` ``manage.py jobworker`` processes with ``args`` (e.g. --stop-when-empty)."""
    cmd = [sys.executable, str(MANAGE), "jobworker", *args]
    procs = [subprocess.Popen(cmd, env=env or worker_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=ROOT)
             for _ in range(n)]
    return WorkerPool(procs)


@pytest.fixture
def workers(transactional_db) -> Iterator:
    """``workers(n, *args)`` starts real worker processes on the committed test database."""
    pools: list[WorkerPool] = []

    def start(n: int, *args: str, env: dict[str, str] | None = None) -> WorkerPool:
        pool = start_workers(n, *args, env=env)
        pools.append(pool)
        return pool

    yield start
    for pool in pools:
        pool.kill()


def run_command(*args: str, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``manage.py <args>`` in a subprocess against the test database."""
    return subprocess.run([sys.executable, str(MANAGE), *args], env=env or worker_env(),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
