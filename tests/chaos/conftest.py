"""Helpers for the fault-injection tests: a fleet of real worker processes that can be killed
and replaced, the outcome of a run read back from the database and what kills may explain in
it, and a redis-server of a test's own that it can restart."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
from demo.models import JobRun
from django.db import connection
from django.test import override_settings

from django_jobguard import stores
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob
from tests.support import MANAGE, ROOT, wait_for, worker_env

CHAOS_ENV = {"JOBGUARD_RETRY_AFTER": "2", "JOBGUARD_DEFAULT_TIMEOUT": "1",
             "JOBGUARD_EXTRA_JOB_MODULES": "tests.chaos.jobs"}


#: For tests that assert a surviving worker never loses its job or has a run cut short: a
#: heartbeat starved for 2 s on a loaded 2-core machine loses a 2 s lease, and a 10 ms job
#: can outlast a 1 s timeout there. A live worker keeps an 8 s lease unless it stalls for 5 s.
LONG_LEASE = {"JOBGUARD_RETRY_AFTER": "8", "JOBGUARD_DEFAULT_TIMEOUT": "6"}


def chaos_env(**extra: str) -> dict[str, str]:
    """Worker environment with a 2 s lease (RETRY_AFTER) so crash recovery is quick;
    ``extra`` overrides it (e.g. ``**LONG_LEASE``)."""
    return worker_env(**{**CHAOS_ENV, **extra})


@dataclass
class Fleet:
    """Worker processes started with the same arguments; killed ones are remembered."""

    args: tuple[str, ...]
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)
    logs: list = field(default_factory=list)  # stderr of each process (a file: never blocks)

    def start(self, n: int = 1) -> list[subprocess.Popen]:
        new = []
        for _ in range(n):
            log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in cleanup())
            new.append(subprocess.Popen([sys.executable, str(MANAGE), "jobworker", *self.args],
                                        env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=log, text=True))
            self.logs.append(log)
        self.procs += new
        return new

    @property
    def alive(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen) -> None:
        proc.kill()  # SIGKILL: no cleanup, no ack, no lease given back
        proc.wait()
        self.killed.add(proc.pid)

    def stop_all(self, timeout: float = 30) -> list[int]:
        """SIGTERM the living workers and return their exit codes. A worker just started is
        first let reach its loop (its row is written after its signal handlers are set): a
        SIGTERM during Django's start-up would end it with -15, as it would any program."""
        from django_jobguard.models import Worker

        living = self.alive
        wait_for(lambda: all(proc.poll() is not None
                             or Worker.objects.filter(pid=proc.pid).exists()
                             for proc in living), timeout=60, what="workers started")
        for proc in living:
            proc.terminate()
        codes = []
        for proc in living:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            codes.append(proc.returncode)
        return codes

    def kill_as_it_goes(self, label: str, total: int, kills: int) -> None:
        """SIGKILL a random living worker ``kills`` times, spread over the run by progress,
        not by wall-clock time (the k-th once ``k * total / (kills + 2)`` runs of ``label``
        were recorded, so each lands while jobs are in flight), each replaced by a new one."""
        rng = random.Random()  # seeded by pytest-randomly
        for k in range(1, kills + 1):
            wait_for(lambda k=k: JobRun.objects.filter(label=label).count()
                     >= k * total // (kills + 2), timeout=120)
            self.kill(rng.choice(self.alive))
            self.start(1)

    def finish(self) -> None:
        """Wait for the queue to empty, then stop the workers: each must exit with 0."""
        wait_for(lambda: not QueuedJob.objects.exists(), timeout=120)
        codes = self.stop_all()  # a graceful stop flushes what ran since the last heartbeat
        assert codes and all(code == 0 for code in codes), self.errors()

    def errors(self) -> str:
        """Everything the workers logged (warnings and errors go to stderr)."""
        return "\n".join(self.log_of(proc) for proc in self.procs)

    def log_of(self, proc: subprocess.Popen) -> str:
        """What ``proc`` (one of these workers) logged so far."""
        log = self.logs[self.procs.index(proc)]
        log.seek(0)
        return log.read()

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def fleet(transactional_db) -> Iterator:
    """``fleet(*args, env=...)`` makes a :class:`Fleet` (all its processes die with the test)."""
    made: list[Fleet] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Fleet:
        made.append(Fleet(args=args, env=env or chaos_env()))
        return made[-1]

    yield make
    for item in made:
        item.cleanup()


@dataclass
class Outcome:
    """What happened to a set of dispatched jobs, read from JobRun and the queue tables."""

    ids: set[str]
    runs: dict[str, list[dict]]
    failed: dict[str, FailedJob]
    queued: int

    @classmethod
    def read(cls, ids: Iterable[str], label: str) -> Outcome:
        runs: dict[str, list[dict]] = defaultdict(list)
        for run in JobRun.objects.filter(label=label).order_by("id").values(
                "job_id", "pid", "attempt", "started_at", "ended_at"):
            runs[run["job_id"]].append(run)
        return cls(ids=set(ids), runs=dict(runs),
                   failed={str(f.id): f for f in FailedJob.objects.all()},
                   queued=QueuedJob.objects.count())

    @property
    def completed(self) -> set[str]:
        return {job_id for job_id, runs in self.runs.items()
                if any(r["ended_at"] is not None for r in runs)}

    def assert_only_kills_repeat(self, killed: set[int]) -> None:
        """At-least-once with lease recovery (docs/guarantees.md): a run cut short, or a
        completed run followed by another, only in a worker that was ``killed`` (between
        ``handle()`` returning and its ack); each re-run is a new attempt; no surviving
        worker completed a job twice."""
        for job_id, runs in self.runs.items():
            for run in runs:
                if run["ended_at"] is None:  # cut short: only by a kill
                    assert run["pid"] in killed, (job_id, runs)
            done = [r for r in runs if r["ended_at"] is not None]
            for earlier in done[:-1]:  # repeated after completing: only if killed before the ack
                assert earlier["pid"] in killed, (job_id, runs)
            attempts = [r["attempt"] for r in runs]
            assert attempts == sorted(set(attempts)), (job_id, runs)  # each re-run an attempt
        survivors_done = [r for runs in self.runs.values() for r in runs
                          if r["ended_at"] is not None and r["pid"] not in killed]
        assert len({r["job_id"] for r in survivors_done}) == len(survivors_done)  # never twice


def stopped(pid: int) -> bool:
    """Whether the process ``pid`` is stopped (SIGSTOP took effect)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def terminate_backends(app: str) -> int:
    """``pg_terminate_backend`` on every connection of the workers started with
    ``PGAPPNAME=app`` (a database restart, as the workers see it); returns how many."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE application_name = %s AND datname = current_database() "
                       "AND pid <> pg_backend_pid()", [app])
        return len(cursor.fetchall())


def stop_and_read(procs: Sequence[subprocess.Popen | None], logs: Sequence[IO[str]]
                  ) -> list[str]:
    """SIGTERM the workers still running (resumed first, if a test stopped them with
    SIGSTOP), wait for them, and return what each log file holds (closing it)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    return outputs


# -- a redis-server of the test's own ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """A redis-server of this test alone, keeping its files in ``directory``: without
    persistence, or (``persistent``) with an append-only file that is fsynced before Redis
    answers a write (``appendfsync always``), so even SIGKILL loses no acknowledged write."""

    def __init__(self, directory: Path, *, persistent: bool = False) -> None:
        self.port = _free_port()
        self.directory = directory
        self.persistent = persistent
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (again, on the same port and files); returns once it answers PING, i.e.
        after it has loaded its append-only file."""
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent \
            else ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir",
             str(self.directory), "--save", "", *persistence],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, timeout=20)

    def answers(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                              text=True).stdout.strip() == "PONG"

    def shutdown(self) -> None:
        """``SHUTDOWN NOSAVE``: without persistence, everything it held is gone."""
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"],
                       capture_output=True)
        if self.proc is not None:
            self.proc.wait(timeout=20)

    def kill(self) -> None:
        """SIGKILL: no shutdown work at all (what the append-only file survives)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def restart_midway(self, label: str, total: int, *, finished_meanwhile: int,
                       until: Callable[[], bool] | None = None,
                       gate: Path | None = None) -> None:
        """Once a quarter of the ``total`` jobs ran (runs of ``label``), shut this server down
        until ``finished_meanwhile`` more of them finished without it (only their lock
        release fails) and ``until()`` holds, if given; then start it again. ``gate``: the
        file the later jobs wait for, opened once the server is down, so that some are left
        to finish without it however slow this process is."""
        wait_for(lambda: JobRun.objects.filter(label=label).count() >= total // 4, timeout=60)
        self.shutdown()
        ended = JobRun.objects.filter(label=label, ended_at__isnull=False)
        down_at = ended.count()
        if gate is not None:
            gate.touch()
        wait_for(lambda: ended.count() >= down_at + finished_meanwhile
                 and (until is None or until()), timeout=60)
        self.start()


@contextmanager
def _redis_store_on(server: PrivateRedis) -> Iterator[PrivateRedis]:
    """Run ``server`` as this process's Redis store; shut it down afterwards."""
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url,
                          "KEY_PREFIX": "jgchaos"}}
    try:
        with override_settings(CACHES=caches,
                               JOBGUARD={**jobguard_settings.user_settings, "STORE": "redis"}):
            stores.reset()
            yield server
    finally:
        stores.reset()
        server.shutdown()


@pytest.fixture
def private_redis(tmp_path):
    """A :class:`PrivateRedis` without persistence, this process's Redis store."""
    server = PrivateRedis(tmp_path)
    server.start()
    with _redis_store_on(server):
        yield server


@pytest.fixture
def aof_redis(tmp_path):
    """A :class:`PrivateRedis` with its append-only file, this process's Redis store."""
    server = PrivateRedis(tmp_path, persistent=True)
    server.start()
    with _redis_store_on(server):
        yield server
