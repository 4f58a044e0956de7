"""Real processes for tests: ``manage.py jobworker`` workers and commands against this test
run's database and store, and the services the suite may use."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_jobguard.conf import jobguard_settings

ROOT = Path(__file__).resolve().parent.parent.parent
MANAGE = ROOT / "testproject" / "manage.py"
REDIS_URL = os.environ.get("JOBGUARD_REDIS_URL", "")
POSTGRES = os.environ.get("JOBGUARD_TEST_DATABASE_URL", "").startswith("postgres")

requires_postgres = pytest.mark.skipif(
    not POSTGRES, reason="needs PostgreSQL: set JOBGUARD_TEST_DATABASE_URL=postgres://...")
requires_redis = pytest.mark.skipif(
    not REDIS_URL, reason="needs Redis: set JOBGUARD_REDIS_URL=redis://127.0.0.1:6379/0")


def worker_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess that must use this test run's database and store."""
    env = dict(os.environ)
    env["JOBGUARD_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["JOBGUARD_STORE"] = jobguard_settings.STORE
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    # The Redis URL a subprocess gets is final: this run's URL was already moved to the xdist
    # worker's database (tests/settings.py), and a URL in ``extra`` (a private redis-server)
    # must not be moved again by the subprocess's own settings.
    env["JOBGUARD_XDIST_REDIS"] = env.get("PYTEST_XDIST_WORKER", "")
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


def run_command(*args: str, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``manage.py <args>`` in a subprocess against the test database."""
    return subprocess.run([sys.executable, str(MANAGE), *args], env=env or worker_env(),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def ran_at_once(runs: list) -> int:
    """The most runs (dicts or objects with ``started_at`` and ``ended_at``) running at the
    same moment (one ending as another starts does not count as overlapping)."""
    def at(run: Any, name: str) -> Any:
        return run[name] if isinstance(run, dict) else getattr(run, name)

    edges = sorted([(at(r, "started_at"), 1) for r in runs]
                   + [(at(r, "ended_at"), -1) for r in runs],
                   key=lambda edge: (edge[0], edge[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most
