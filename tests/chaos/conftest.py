"""Helpers for the fault-injection tests: a fleet of real worker processes that can be killed
and replaced, and the outcome of a run read back from the database."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pytest
from demo.models import JobRun

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

    def errors(self) -> str:
        """Everything the workers logged (warnings and errors go to stderr)."""
        out = []
        for log in self.logs:
            log.seek(0)
            out.append(log.read())
        return "\n".join(out)

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
