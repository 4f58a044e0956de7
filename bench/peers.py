"""Burn-down: jobguard beside its peers on the same PostgreSQL (and Redis for celery). N no-op
jobs (default 50,000, ``--burn-jobs``) are made visible at once to idle workers, 1 and 2
worker processes (``--processes``), timed until all are done; the median of R rounds
(default 3, ``--rounds``) in rotated order. Each tool runs the way its documentation starts
a worker:

- jobguard: ``manage.py jobworker`` (the default, adaptive claim) and ``--batch 10``;
- PgQueuer: its QueueManager on one asyncpg connection (``pgqueuer.run()``, what ``pgq run``
  runs), ``--batch-size 10`` (its default) and a larger batch for short jobs
  (``JOBGUARD_BENCH_PGQUEUER_BATCH``, default 100), after ``pgq install`` and ``pgq autovac``;
- Oban for Python: ``oban start --queues burn:10`` (``JOBGUARD_BENCH_OBAN_LIMIT``), in a
  Python >= 3.12 venv this module builds under ``bench/.cache/`` when missing;
- django-tasks + django-tasks-db: ``manage.py db_worker`` (one task at a time per process);
- procrastinate: ``procrastinate worker --concurrency 1``, one process per worker, an
  ``async def`` no-op task (its native kind; a sync task ran ~25% slower here);
- celery: ``celery worker --pool prefork -c N`` with a Redis broker (no result backend).

Besides jobs/s, each run measures **CPU per job**: the utime + stime of the worker processes
(with their children) and of the PostgreSQL backends serving them (for celery: the Redis
server process), from just before the fill to the last job, divided by the jobs
(``common.CpuMeter``). A peer that is not installed, or Oban without a Python >= 3.12, is
reported as skipped with the reason.
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import throughput
from bench.common import (
    ROOT,
    Goal,
    Report,
    Run,
    Table,
    child_env,
    conninfo,
    django_command,
    dsn,
    knob,
    measure_processing,
    ratio,
    raw_connect,
    spawn,
    truncate,
    wait_for_connections,
    wanted,
    worker_connections,
)
from tests.support.waiting import wait_for

DTASKS_TABLE = "django_tasks_database_dbtaskresult"
PROCRASTINATE_TABLES = ("procrastinate_jobs", "procrastinate_events",
                        "procrastinate_periodic_defers")
PGQUEUER_TABLES = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")
OBAN_TABLES = ("oban_jobs", "oban_producers", "oban_leaders")


def sizes(smoke: bool) -> dict[str, int]:
    """Jobs per burn-down and rounds (``--burn-jobs``, ``--rounds``)."""
    if smoke:
        return {"jobs": 500, "rounds": 1}
    return {"jobs": int(knob("BURN_JOBS", 50_000)), "rounds": int(knob("ROUNDS", 3))}


def process_counts(smoke: bool) -> list[int]:
    """Worker processes per tool (``--processes``, default 1 and 2)."""
    raw = os.environ.get("JOBGUARD_BENCH_PROCESSES", "").strip()
    if smoke or not raw:
        return [1, 2]
    try:
        counts = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"JOBGUARD_BENCH_PROCESSES={raw!r}: expected e.g. 1,2")
    if not counts or min(counts) < 1:
        raise SystemExit(f"JOBGUARD_BENCH_PROCESSES={raw!r}: expected positive counts")
    return counts


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def settle(procs, minimum: int, timeout: float = 60) -> None:
    """Wait until the workers hold at least ``minimum`` connections and stop opening more."""
    wait_for_connections(minimum, procs, timeout=timeout)
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 0.5:
        now = worker_connections()
        if now != last:
            last, stable_since = now, time.monotonic()
        time.sleep(0.05)


#: jobguard's best documented configuration for short jobs: batched completion, and no line
#: per job (``-v 0``; PgQueuer and Oban print none either).
COMPLETION_WINDOW = 0.01
QUIET = ("-v", "0")
GROUPED = f"jobguard, COMPLETION_WINDOW {COMPLETION_WINDOW}, -v 0"
GROUPED_DURABLE = f"{GROUPED}, SYNCHRONOUS_ACKS"
#: Async no-op jobs (``async def handle()``) on the event loop, 10 at a time, as PgQueuer and
#: Oban run theirs: issue 29 asks their CPU per job to stay within 1.2x of sync jobs'.
ASYNC_FLAGS = ("--async-concurrency", "10")
ASYNC = "jobguard async (--async-concurrency 10)"
ASYNC_GROUPED = f"{ASYNC}, COMPLETION_WINDOW {COMPLETION_WINDOW}, -v 0"


def burn_timeout(n: int) -> float:
    """Seconds a burn-down may take: 10 min, or more at 25 jobs/s for large N."""
    return max(600, n / 25)


# -- django-tasks-db ---------------------------------------------------------------------------


def django_tasks_db(processes: int, n: int, *, cpu: bool = False) -> Run:
    from django.db import transaction

    from bench.dtasks import noop

    truncate(DTASKS_TABLE)
    argv = django_command("db_worker", "--interval", "0.05", "--no-startup-delay")

    def fill(count: int) -> None:
        with transaction.atomic():
            for _ in range(count):
                noop.enqueue()

    run = measure_processing(
        tool="django-tasks-db", processes=processes, jobs=n,
        start=lambda: spawn(argv, count=processes),
        ready=lambda procs: settle(procs, processes),
        fill=fill,
        remaining_sql=f"SELECT count(*) FROM {DTASKS_TABLE} WHERE status IN ('READY', 'RUNNING')",
        cpu=cpu, timeout=burn_timeout(n),
    )
    truncate(DTASKS_TABLE)
    return run


# -- procrastinate -----------------------------------------------------------------------------


def procrastinate_env() -> dict[str, str]:
    return child_env(JOBGUARD_BENCH_CONNINFO=conninfo())


def ensure_procrastinate_schema() -> None:
    with raw_connect() as conn:
        present = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0]
    if not present:
        os.environ["JOBGUARD_BENCH_CONNINFO"] = conninfo()
        from bench.procrastinate_app import app

        with app.open():
            app.schema_manager.apply_schema()


def procrastinate(processes: int, n: int, *, cpu: bool = False) -> Run:
    ensure_procrastinate_schema()
    os.environ["JOBGUARD_BENCH_CONNINFO"] = conninfo()
    from bench.procrastinate_app import anoop, app

    truncate(*PROCRASTINATE_TABLES)
    argv = [sys.executable, "-m", "procrastinate", "--app", "bench.procrastinate_app.app",
            "worker", "--queues", "jgbench", "--concurrency", "1"]

    def fill(count: int) -> None:
        with app.open():
            # the async task: procrastinate runs it on its event loop, faster than a sync one
            anoop.batch_defer(*({} for _ in range(count)))  # one statement, one transaction

    run = measure_processing(
        tool="procrastinate", processes=processes, jobs=n,
        start=lambda: spawn(argv, count=processes, env=procrastinate_env()),
        ready=lambda procs: settle(procs, 2 * processes),
        fill=fill,
        remaining_sql="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        cpu=cpu, timeout=burn_timeout(n),
    )
    truncate(*PROCRASTINATE_TABLES)
    return run


# -- celery ------------------------------------------------------------------------------------


def celery_ready(app, procs) -> None:
    """Wait until the celery worker answers a ping."""
    def pong() -> bool:
        if procs[0].poll() is not None:
            raise RuntimeError(f"celery worker exited with {procs[0].returncode}")
        return bool(app.control.inspect(timeout=0.5).ping())

    wait_for(pong, timeout=60, interval=0.2, what="celery ping")


def redis_server_pid(client) -> list[int]:
    """The Redis server's pid when it runs on this machine (its CPU is celery's broker's)."""
    try:
        pid = int(client.info("server")["process_id"])
    except Exception:
        return []
    return [pid] if Path(f"/proc/{pid}").exists() else []


def celery(processes: int, n: int, *, cpu: bool = False) -> Run:
    from bench.celery_app import DONE_KEY, QUEUE, app, noop

    client = app.connection_for_write().default_channel.client
    hold = f"{QUEUE}-hold"
    client.delete(QUEUE, hold, DONE_KEY)
    argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
            "--pool", "prefork", "-c", str(processes), "-Q", QUEUE, "--without-gossip",
            "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]

    def fill(count: int) -> None:
        # Publish to a queue no worker reads, then rename it in one atomic step: the workers
        # see all the messages at once, as the database tools see one committed transaction.
        with app.producer_or_acquire() as producer:
            for _ in range(count):
                noop.apply_async(queue=hold, producer=producer)
        client.rename(hold, QUEUE)

    run = measure_processing(
        tool="celery (redis)", processes=processes, jobs=n,
        start=lambda: spawn(argv),
        ready=lambda procs: celery_ready(app, procs), fill=fill,
        remaining=lambda: n - int(client.get(DONE_KEY) or 0),
        cpu=cpu, store_pids=redis_server_pid(client), timeout=burn_timeout(n),
    )
    client.delete(QUEUE, hold, DONE_KEY)
    return run


# -- PgQueuer ----------------------------------------------------------------------------------


def pgqueuer_batch() -> int:
    """The larger ``--batch-size`` PgQueuer runs with beside its default of 10."""
    return int(knob("PGQUEUER_BATCH", 100))


def ensure_pgqueuer_schema() -> None:
    """``pgq install`` and ``pgq autovac`` (its recommended autovacuum settings) once."""
    with raw_connect() as conn:
        present = conn.execute("SELECT to_regclass('pgqueuer')").fetchone()[0]
    if present:
        return
    for command in ("install", "autovac"):
        subprocess.run([sys.executable, "-m", "pgqueuer", "--pg-dsn", dsn(), command],
                       check=True, cwd=ROOT, capture_output=True, text=True)


def pgqueuer_env() -> dict[str, str]:
    return child_env(JOBGUARD_BENCH_DSN=dsn())


async def _pgqueuer_enqueue(entrypoint: str, payloads: list[bytes | None]) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn())
    try:
        await Queries(AsyncpgDriver(conn)).enqueue([entrypoint] * len(payloads), payloads,
                                                   [0] * len(payloads))
    finally:
        await conn.close()


def pgqueuer(processes: int, n: int, *, batch: int = 10, cpu: bool = False) -> Run:
    from bench.pgqueuer_app import NOOP

    ensure_pgqueuer_schema()
    truncate(*PGQUEUER_TABLES)
    argv = [sys.executable, "-m", "bench.pgqueuer_app", "--batch-size", str(batch)]

    def fill(count: int) -> None:
        # Queries.enqueue takes lists: one statement, one transaction
        asyncio.run(_pgqueuer_enqueue(NOOP, [None] * count))

    run = measure_processing(
        tool=f"PgQueuer (batch {batch})", processes=processes, jobs=n,
        start=lambda: spawn(argv, count=processes, env=pgqueuer_env()),
        ready=lambda procs: settle(procs, processes),
        fill=fill,
        remaining_sql=f"SELECT count(*) FROM pgqueuer WHERE entrypoint = '{NOOP}'",
        cpu=cpu, timeout=burn_timeout(n),
    )
    truncate(*PGQUEUER_TABLES)
    return run


# -- Oban for Python ---------------------------------------------------------------------------

#: What the Oban venv holds; a change rebuilds it.
OBAN_REQUIREMENTS = ["oban>=0.7,<0.8", "psycopg[binary]>=3.2", "redis>=5"]
CACHE = Path(os.environ.get("JOBGUARD_BENCH_CACHE", ROOT / "bench" / ".cache"))
OBAN_VENV = CACHE / "oban-venv"


class Unavailable(Exception):
    """A peer cannot run on this machine; the message says why."""


def python312() -> str:
    """A Python >= 3.12 interpreter: ``JOBGUARD_BENCH_OBAN_PYTHON``, else pyenv's newest 3.12+,
    else ``python3.13`` / ``python3.12`` on the PATH (each tried: a pyenv shim of a version
    that is not selected is on the PATH and fails)."""
    chosen = os.environ.get("JOBGUARD_BENCH_OBAN_PYTHON")
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [chosen] if chosen else [
        *sorted(glob.glob(f"{root}/versions/3.1[2-9]*/bin/python"), reverse=True),
        *filter(None, (shutil.which(name) for name in ("python3.13", "python3.12")))]
    for python in candidates:
        try:
            subprocess.run([python, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                           check=True, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        return python
    raise Unavailable("Oban needs Python >= 3.12: none found (set JOBGUARD_BENCH_OBAN_PYTHON)"
                      if not chosen else f"JOBGUARD_BENCH_OBAN_PYTHON={chosen} is not a "
                      f"working Python >= 3.12")


_oban_state: dict[str, str] = {}


def oban_venv(timeout: float) -> Path:
    """The Oban venv's bin directory, built (``python3.12 -m venv`` + pip) when missing or
    when :data:`OBAN_REQUIREMENTS` changed; :class:`Unavailable` when that fails or takes
    longer than ``timeout`` seconds (remembered for the rest of the run)."""
    if "error" in _oban_state:
        raise Unavailable(_oban_state["error"])
    marker = OBAN_VENV / "jobguard-bench-requirements.txt"
    wanted = "\n".join(OBAN_REQUIREMENTS) + "\n"
    if marker.exists() and marker.read_text() == wanted:
        return OBAN_VENV / "bin"
    try:
        python = python312()
        # built in place (a venv's scripts name its path), complete once the marker is written
        shutil.rmtree(OBAN_VENV, ignore_errors=True)
        deadline = time.monotonic() + timeout
        print(f"building Oban's venv in {OBAN_VENV} with {python} ...", flush=True)
        for argv in ([python, "-m", "venv", str(OBAN_VENV)],
                     [str(OBAN_VENV / "bin" / "python"), "-m", "pip", "install", "-q",
                      *OBAN_REQUIREMENTS]):
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(argv, timeout)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=left)
            if done.returncode:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise Unavailable(f"building Oban's venv failed: {' | '.join(tail)}")
        marker.write_text(wanted)
    except subprocess.TimeoutExpired:
        _oban_state["error"] = f"building Oban's venv took over {timeout:.0f} s"
        raise Unavailable(_oban_state["error"])
    except Unavailable as exc:
        _oban_state["error"] = str(exc)
        raise
    return OBAN_VENV / "bin"


def oban_env(app_name: str | None = None) -> dict[str, str]:
    env = child_env()
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if app_name:
        env["PGAPPNAME"] = app_name
    return env


def ensure_oban_schema(bin_dir: Path) -> None:
    with raw_connect() as conn:
        present = conn.execute("SELECT to_regclass('oban_jobs')").fetchone()[0]
    if not present:
        subprocess.run([str(bin_dir / "oban"), "install", "--dsn", dsn()], check=True,
                       cwd=ROOT, capture_output=True, text=True, env=oban_env())


def oban_limit() -> int:
    return int(knob("OBAN_LIMIT", 10))


def oban_argv(bin_dir: Path) -> list[str]:
    """``oban start`` on the ``burn`` queue; ``--cron-modules`` names our module, so the CLI
    does not search the whole checkout for cron workers (it imports what it finds)."""
    return [str(bin_dir / "oban"), "start", "--dsn", dsn(), "--queues",
            f"burn:{oban_limit()}", "--cron-modules", "bench.oban_app", "--log-level", "warning"]


def oban_ready(procs, processes: int) -> None:
    """Wait until each node registered its producer for the queue and its connections
    settled."""
    with raw_connect() as conn:
        def up() -> bool:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"oban start exited with {proc.returncode}")
            return conn.execute("SELECT count(*) FROM oban_producers WHERE queue = 'burn'"
                                ).fetchone()[0] >= processes

        wait_for(up, timeout=60, interval=0.05, what=f"{processes} Oban producers")
    settle(procs, 2 * processes)


def oban_client(bin_dir: Path, *args: str, timeout: float = 600) -> str:
    """Run ``python -m bench.oban_app`` (the producers) in the Oban venv; its output."""
    done = subprocess.run([str(bin_dir / "python"), "-m", "bench.oban_app", "--dsn", dsn(),
                           *args], cwd=ROOT, env=oban_env("jgbench-producer"),
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"bench.oban_app {' '.join(args)} failed: "
                           f"{(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout


def oban(processes: int, n: int, *, cpu: bool = False, venv_timeout: float = 900) -> Run:
    bin_dir = oban_venv(venv_timeout)
    ensure_oban_schema(bin_dir)
    truncate(*OBAN_TABLES)

    run = measure_processing(
        tool=f"Oban (burn:{oban_limit()})", processes=processes, jobs=n,
        start=lambda: spawn(oban_argv(bin_dir), count=processes, env=oban_env()),
        ready=lambda procs: oban_ready(procs, processes),
        # the jobs are visible from the producer's commit; its exit (closing its pool) comes
        # a few ms later, before the clock starts
        fill=lambda count: oban_client(bin_dir, "fill", str(count)),
        remaining_sql="SELECT count(*) FROM oban_jobs WHERE queue = 'burn' "
                      "AND state IN ('available', 'scheduled', 'executing', 'retryable')",
        cpu=cpu, timeout=burn_timeout(n),
    )
    truncate(*OBAN_TABLES)
    return run


# -- the scenario ------------------------------------------------------------------------------


@dataclass
class System:
    label: str
    measure: Callable[[int, int], Run]
    #: None when it can run here, else why not (checked once, before the rounds)
    unavailable: Callable[[], str | None]


def _module_missing(module: str) -> Callable[[], str | None]:
    return lambda: (None if installed(module)
                    else "not installed (pip install -e '.[bench]'), skipped")


def systems(smoke: bool) -> list[System]:
    big = pgqueuer_batch()
    venv_timeout = 240 if smoke else 900

    def oban_missing() -> str | None:
        try:
            oban_venv(venv_timeout)
        except Unavailable as exc:
            return f"skipped: {exc}"
        return None

    return [
        System("jobguard", lambda p, n: throughput.jobguard_processing(p, n, cpu=True),
               lambda: None),
        System("jobguard --batch 10",
               lambda p, n: throughput.jobguard_processing(p, n, batch=10, cpu=True),
               lambda: None),
        System(GROUPED,
               lambda p, n: throughput.jobguard_processing(
                   p, n, completion_window=COMPLETION_WINDOW, extra=QUIET, cpu=True),
               lambda: None),
        System(GROUPED_DURABLE,
               lambda p, n: throughput.jobguard_processing(
                   p, n, completion_window=COMPLETION_WINDOW, synchronous_acks=True,
                   extra=QUIET, cpu=True), lambda: None),
        System(ASYNC,
               lambda p, n: throughput.jobguard_processing(p, n, extra=ASYNC_FLAGS, cpu=True,
                                                           is_async=True), lambda: None),
        System(ASYNC_GROUPED,
               lambda p, n: throughput.jobguard_processing(
                   p, n, completion_window=COMPLETION_WINDOW, extra=(*ASYNC_FLAGS, *QUIET),
                   cpu=True, is_async=True), lambda: None),
        System("PgQueuer (batch 10)", lambda p, n: pgqueuer(p, n, cpu=True),
               _module_missing("pgqueuer")),
        System(f"PgQueuer --batch-size {big}", lambda p, n: pgqueuer(p, n, batch=big, cpu=True),
               _module_missing("pgqueuer")),
        System(f"Oban (burn:{oban_limit()})",
               lambda p, n: oban(p, n, cpu=True, venv_timeout=venv_timeout), oban_missing),
        System("procrastinate", lambda p, n: procrastinate(p, n, cpu=True),
               _module_missing("procrastinate")),
        System("django-tasks-db", lambda p, n: django_tasks_db(p, n, cpu=True),
               _module_missing("django_tasks_db")),
        System("celery (redis)", lambda p, n: celery(p, n, cpu=True), _module_missing("celery")),
    ]


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def run(*, smoke: bool) -> Report:
    n = sizes(smoke)
    jobs, rounds = n["jobs"], n["rounds"]
    counts = process_counts(smoke)
    report = Report(name="peers")
    chosen = []
    for system in systems(smoke):
        if not wanted(system.label):  # JOBGUARD_BENCH_TOOLS
            continue
        reason = system.unavailable()
        if reason:
            report.notes.append(f"{system.label}: {reason}")
            print(f"{system.label}: {reason}", flush=True)
        else:
            chosen.append(system)
    # samples[label][processes] = [Run, ...]
    samples: dict[str, dict[int, list[Run]]] = {s.label: {p: [] for p in counts} for s in chosen}
    for turn in range(rounds):
        order = chosen[turn % len(chosen):] + chosen[:turn % len(chosen)] if chosen else []
        for processes in counts:
            for system in order:
                try:
                    samples[system.label][processes].append(system.measure(processes, jobs))
                except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError,
                        Unavailable) as exc:  # one peer's failure is a note
                    report.notes.append(f"{system.label} with {processes} workers, round "
                                        f"{turn + 1}, failed: {exc}")

    medians: dict[str, dict[int, dict[str, float | None]]] = {}
    for label, by_count in samples.items():
        for processes, runs in by_count.items():
            medians.setdefault(label, {})[processes] = {
                "rate": _median([r.rate for r in runs]),
                "worker_ms": _median([r.worker_ms_per_job for r in runs]),
                "store_ms": _median([r.store_ms_per_job for r in runs]),
                "total_ms": _median([r.worker_ms_per_job + r.store_ms_per_job
                                     if r.store_ms_per_job is not None
                                     and r.worker_ms_per_job is not None else None
                                     for r in runs]),
                "rounds": len(runs),
            }
    rows = []
    base = medians.get("jobguard", {})
    for processes in counts:
        jg = base.get(processes, {})
        for label in samples:
            m = medians[label][processes]
            rows.append([label, processes, m["rate"], ratio(m["rate"], jg.get("rate")),
                         m["worker_ms"], m["store_ms"], m["total_ms"],
                         ratio(m["total_ms"], jg.get("total_ms")), m["rounds"]])
    report.tables.append(Table(
        title=f"Burn-down of {jobs:,} no-op jobs: jobs/s and CPU ms per job (median of "
              f"{rounds} round{'s' if rounds > 1 else ''}; ratios to the default jobguard "
              f"worker at the same process count)",
        columns=["tool", "workers", "jobs/s", "÷ jobguard", "worker CPU ms/job",
                 "store CPU ms/job", "total CPU ms/job", "CPU ÷ jobguard", "rounds"],
        rows=rows))
    report.notes.append("store CPU: the PostgreSQL backends serving the workers; for celery the "
                        "Redis server process (all its clients' work, so only meaningful on a "
                        "quiet machine). PostgreSQL's background processes (WAL writer, "
                        "checkpointer, autovacuum) are not counted for anyone.")
    report.data["medians"] = medians
    report.data["runs"] = {label: {p: [vars(r) | {"rate": r.rate} for r in runs]
                                   for p, runs in by_count.items()}
                           for label, by_count in samples.items()}
    report.data["settings"] = {"jobs": jobs, "rounds": rounds, "processes": counts,
                               "pgqueuer_batch": pgqueuer_batch(), "oban_limit": oban_limit()}
    _goals(report, medians, counts)
    return report


def _goals(report: Report, medians: dict, counts: list[int]) -> None:
    def rate(label: str, processes: int) -> float | None:
        return medians.get(label, {}).get(processes, {}).get("rate")

    for processes in counts:  # issue 29: batched completion against the fastest peers
        grouped = rate(GROUPED, processes)
        for peer in ("PgQueuer (batch 10)", f"PgQueuer --batch-size {pgqueuer_batch()}",
                     f"Oban (burn:{oban_limit()})"):
            theirs = rate(peer, processes)
            report.goals.append(Goal(
                f"{GROUPED} >= 1.5x {peer} at {processes} workers",
                f"{ratio(grouped, theirs) or 0:.2f}x",
                grouped >= 1.5 * theirs if grouped and theirs else None))
    best = max(filter(None, (rate(GROUPED, p) for p in counts)), default=None)
    durable = max(filter(None, (rate(GROUPED_DURABLE, p) for p in counts)), default=None)
    report.goals.append(Goal(">= 10,000 no-op jobs/s (batched completion)",
                             f"{best or 0:,.0f}/s", best >= 10_000 if best else None))
    report.goals.append(Goal(">= 5,000 no-op jobs/s with SYNCHRONOUS_ACKS=True",
                             f"{durable or 0:,.0f}/s", durable >= 5_000 if durable else None))

    def total_ms(label: str, processes: int) -> float | None:
        return medians.get(label, {}).get(processes, {}).get("total_ms")

    for sync_label, async_label in (("jobguard", ASYNC), (GROUPED, ASYNC_GROUPED)):
        for processes in counts:  # issue 29: async jobs cost no more than 1.2x sync ones
            sync_ms, async_ms = total_ms(sync_label, processes), total_ms(async_label, processes)
            report.goals.append(Goal(
                f"{async_label}: CPU per job <= 1.2x {sync_label}'s at {processes} workers",
                f"{ratio(async_ms, sync_ms) or 0:.2f}x",
                async_ms <= 1.2 * sync_ms if async_ms and sync_ms else None))

    top = counts[-1]
    jg, dtdb = rate("jobguard", top), rate("django-tasks-db", top)
    report.goals.append(Goal(f">= 3x django-tasks-db ({top} workers)",
                             f"{ratio(jg, dtdb) or 0:.1f}x",
                             (ratio(jg, dtdb) or 0) >= 3 if jg and dtdb else None))
    for peer in ("celery (redis)", "procrastinate"):
        for processes in counts:
            j, p = rate("jobguard", processes), rate(peer, processes)
            report.goals.append(Goal(f"default jobworker >= {peer} at {processes} workers",
                                     f"{ratio(j, p) or 0:.2f}x", j >= p if j and p else None))
