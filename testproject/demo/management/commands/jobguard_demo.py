"""``manage.py jobguard_demo``: play the seed scenarios with real worker processes.

Starts ``--workers`` ``manage.py jobworker`` processes, runs each scenario of
``demo/scenarios.py`` against them with live counts, and prints what happened. Exits 1 if a
scenario did not behave as promised. ``--services`` runs the same on PostgreSQL + Redis.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

MANAGE = Path(settings.BASE_DIR) / "manage.py"
DEFAULT_PG = "postgres://127.0.0.1:5432/jobguard_demo"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class Progress:
    """One live status line: rich's spinner or a rewritten line on a terminal, a line per
    change (at most two a second) otherwise."""

    def __init__(self, stdout: Any, *, tty: bool) -> None:
        self.stdout, self.tty = stdout, tty
        self._last, self._last_at, self._status = "", 0.0, None
        self._console = None
        if tty:
            try:
                from rich.console import Console
            except ImportError:
                pass
            else:
                self._console = Console()

    def update(self, text: str) -> None:
        if self._console is not None:
            if self._status is None:
                self._status = self._console.status(text)
                self._status.start()
            else:
                self._status.update(text)
        elif self.tty:
            self.stdout.write(f"\r    {text}\033[K", ending="")
            self.stdout.flush()
        elif text != self._last and time.monotonic() - self._last_at >= 0.5:
            self.stdout.write(f"    … {text}")
            self._last_at = time.monotonic()
        self._last = text

    def done(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
            self.stdout.write(f"    {self._last}")
        elif self.tty:
            self.stdout.write("")
        elif self._last:
            self.stdout.write(f"    ✔ {self._last}")
        self._last, self._last_at = "", 0.0


class Command(BaseCommand):
    help = ("Play jobguard's seed scenarios with real worker processes and report what "
            "happened. Uses (and empties) this project's database.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--workers", type=int, default=2,
                            help="Worker processes to start (default 2).")
        parser.add_argument("--scenario", action="append", default=[],
                            help="Run only this scenario (repeatable); see --list.")
        parser.add_argument("--list", action="store_true", help="List the scenarios.")
        parser.add_argument("--services", action="store_true",
                            help=f"Run on PostgreSQL + Redis: JOBGUARD_TEST_DATABASE_URL "
                                 f"(default {DEFAULT_PG}) and JOBGUARD_REDIS_URL (default "
                                 f"{DEFAULT_REDIS}), locks in Redis.")
        parser.add_argument("--timeout", type=float, default=60,
                            help="Seconds a scenario may take (default 60).")

    def handle(self, *args: Any, **opts: Any) -> None:
        from demo.scenarios import SCENARIOS

        if opts["list"]:
            for scenario in SCENARIOS:
                note = "" if scenario.available() else "  (not available here)"
                self.stdout.write(f"{scenario.slug:<16} {scenario.title}{note}")
            return
        if opts["services"] and not os.environ.get("JOBGUARD_DEMO_SERVICES"):
            return self._rerun_on_services(opts)
        if opts["workers"] < 1:
            raise CommandError("--workers must be at least 1.")
        unknown = set(opts["scenario"]) - {s.slug for s in SCENARIOS}
        if unknown:
            raise CommandError(f"Unknown scenario(s) {sorted(unknown)}; see --list.")
        chosen = [s for s in SCENARIOS if not opts["scenario"] or s.slug in opts["scenario"]]
        self._run(chosen, workers=opts["workers"], timeout=opts["timeout"])

    # -- the run ---------------------------------------------------------------------------

    def _run(self, chosen: list, *, workers: int, timeout: float) -> None:
        from demo.scenarios import Demo
        from django_jobguard.conf import jobguard_settings

        call_command("migrate", verbosity=0)
        _fresh_start()
        db = settings.DATABASES["default"]
        where = f"{db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}"
        self.stdout.write(self.style.MIGRATE_HEADING(
            f"jobguard demo — database: {where}; lock store: {jobguard_settings.STORE}"))
        fd, log_path = tempfile.mkstemp(prefix="jobguard-demo-workers-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            procs = self._start_workers(workers, log)
            tty = self.stdout.isatty()
            demo = Demo(run=secrets.token_hex(4), progress=Progress(self.stdout, tty=tty),
                        timeout=timeout)
            passed, skipped = 0, []
            try:
                self._wait_for_workers(procs)
                for number, scenario in enumerate(chosen, 1):
                    if not scenario.available():
                        skipped.append(scenario.slug)
                        continue
                    self.stdout.write(self.style.MIGRATE_LABEL(f"\n{number}. {scenario.title}"))
                    demo.start()
                    outcome = scenario.run(demo)
                    for line in outcome.lines:
                        self.stdout.write(f"   {line}")
                    self.stdout.write(self.style.SUCCESS("   ✓ as expected") if outcome.ok
                                      else self.style.ERROR("   ✗ NOT as expected"))
                    passed += outcome.ok
            finally:
                codes = self._stop_workers(procs)
        ran = len(chosen) - len(skipped)
        self.stdout.write("")
        if skipped:
            self.stdout.write(f"skipped (their feature is not in this build, or django.tasks "
                              f"is not installed): {', '.join(skipped)}")
        self.stdout.write(f"workers exited with {codes}; their log: {log_path}")
        summary = f"{passed}/{ran} scenarios behaved as expected."
        if passed != ran or any(codes):
            raise CommandError(summary)
        self.stdout.write(self.style.SUCCESS(summary))

    def _start_workers(self, n: int, log: Any) -> list[subprocess.Popen]:
        cmd = [sys.executable, str(MANAGE), "jobworker", "--queue", "default", "--sleep",
               "0.2", "-v", "2"]
        return [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ,
                                 cwd=MANAGE.parent.parent) for _ in range(n)]

    def _wait_for_workers(self, procs: list[subprocess.Popen]) -> None:
        from django_jobguard.models import Worker

        deadline = time.monotonic() + 60
        while Worker.objects.count() < len(procs):
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise CommandError("A worker did not start; see its log above.")
            time.sleep(0.1)
        pids = ", ".join(str(p.pid) for p in procs)
        self.stdout.write(f"{len(procs)} worker processes up (pids {pids})")

    @staticmethod
    def _stop_workers(procs: list[subprocess.Popen]) -> list[int]:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # finish the current job, exit 0
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes

    # -- --services ------------------------------------------------------------------------

    def _rerun_on_services(self, opts: dict) -> None:
        """Run this command again in a process whose settings point at PostgreSQL + Redis."""
        for module, extra in (("psycopg", "postgres"), ("django_redis", "redis")):
            try:
                __import__(module)
            except ImportError:
                raise CommandError(f"--services needs {module}: pip install -e "
                                   f"'.[{extra}]' (or '.[test]').")
        env = dict(os.environ)
        env.setdefault("JOBGUARD_TEST_DATABASE_URL", DEFAULT_PG)
        env.setdefault("JOBGUARD_REDIS_URL", DEFAULT_REDIS)
        env.update(JOBGUARD_STORE="redis", JOBGUARD_DEMO_SERVICES="1")
        env.pop("JOBGUARD_DB_NAME", None)
        _create_database(env["JOBGUARD_TEST_DATABASE_URL"])
        args = [sys.executable, str(MANAGE), "jobguard_demo", "--workers", str(opts["workers"]),
                "--timeout", str(opts["timeout"])]
        for slug in opts["scenario"]:
            args += ["--scenario", slug]
        code = subprocess.call(args, env=env)
        if code:
            sys.exit(code)


def _fresh_start() -> None:
    """Empty the queue and the demo tables so counts belong to this run alone."""
    from demo.models import Invoice, JobRun, Profile
    from django_jobguard.models import FailedJob, JobResult, Lock, QueuedJob, Throttle, Worker

    for model in (QueuedJob, FailedJob, JobResult, Lock, Throttle, Worker, JobRun, Profile,
                  Invoice):
        model.objects.all().delete()


def _create_database(url: str) -> None:
    """Create the PostgreSQL database named in ``url`` if it does not exist yet."""
    from urllib.parse import urlparse

    import psycopg

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    params = {"host": parts.hostname or "127.0.0.1", "port": parts.port or 5432,
              "user": parts.username or "postgres", "password": parts.password or None}
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  [name]).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise CommandError(f"PostgreSQL at {parts.hostname}:{parts.port or 5432} is not "
                           f"usable: {exc}")
