"""What every scenario needs: Django set up on the bench database, worker processes, timing,
machine facts, tables and result files.

A scenario is a module in ``bench/`` with ``run(*, smoke: bool) -> Report``; ``bench/run.py``
prints its tables and writes ``bench/results/<name>.json``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.support.waiting import WaitTimeout, wait_for

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
APP_NAME = "jgbench"  # application_name of every worker connection (PGAPPNAME)
#: Redis list (JOBGUARD_BENCH_REDIS_URL) where steady-rate jobs append ``started - sent``;
#: the peers' apps (bench/*_app.py, bench/jobs.py) spell it out, as they import no common.
LATENCY_KEY = "jgbench:latency"


# -- reports ---------------------------------------------------------------------------------


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


@dataclass
class Goal:
    goal: str
    value: str
    met: bool | None  # None: not measured in this run (smoke, peer missing)


@dataclass
class Report:
    name: str
    tables: list[Table] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return "" if value is None else str(value)


def render(table: Table) -> str:
    cells = [[fmt(c) for c in row] for row in table.rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(table.columns)]
    line = "  ".join(h.ljust(w) for h, w in zip(table.columns, widths, strict=True))
    out = [table.title, line, "-" * len(line)]
    for row in cells:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(out)


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


# -- knobs -----------------------------------------------------------------------------------


def knob(name: str, default: int | float) -> int | float:
    """A size set by ``bench/run.py``'s options or ``JOBGUARD_BENCH_<NAME>`` (e.g.
    ``JOBGUARD_BENCH_BURN_JOBS=100000``), else ``default``; a bad value is an error naming it."""
    raw = os.environ.get(f"JOBGUARD_BENCH_{name}", "").strip()
    if not raw:
        return default
    try:
        value = type(default)(raw)
    except ValueError:
        raise SystemExit(f"JOBGUARD_BENCH_{name}={raw!r}: expected a {type(default).__name__}")
    if value <= 0:
        raise SystemExit(f"JOBGUARD_BENCH_{name}={raw!r}: must be positive")
    return value


def wanted(label: str) -> bool:
    """Whether the tool ``label`` is measured: ``JOBGUARD_BENCH_TOOLS`` (words separated by
    commas, e.g. ``jobguard,celery``) keeps only the tools whose label holds one of them; unset,
    every tool is."""
    raw = os.environ.get("JOBGUARD_BENCH_TOOLS", "").strip()
    return not raw or any(word.strip() in label for word in raw.split(",") if word.strip())


def knob_list(name: str, default: Sequence[float]) -> list[float]:
    """A comma-separated list of positive numbers, as :func:`knob`."""
    raw = os.environ.get(f"JOBGUARD_BENCH_{name}", "").strip()
    if not raw:
        return list(default)
    try:
        values = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"JOBGUARD_BENCH_{name}={raw!r}: expected numbers separated by commas")
    if not values or min(values) <= 0:
        raise SystemExit(f"JOBGUARD_BENCH_{name}={raw!r}: expected positive numbers")
    return values


# -- Django and the database -----------------------------------------------------------------


def setup_django() -> None:
    """Configure Django with ``bench.settings`` in this process (idempotent)."""
    for path in (str(ROOT), str(ROOT / "testproject")):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()


def conninfo(dbname: str | None = None) -> str:
    """libpq connection string of the bench database (or another one on the same server)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    parts = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"],
             "password": db["PASSWORD"], "dbname": dbname or db["NAME"]}
    return " ".join(f"{k}={v}" for k, v in parts.items() if v)


def dsn() -> str:
    """The bench database as a ``postgresql://`` URL (asyncpg and Oban's ``--dsn`` take one)."""
    from urllib.parse import quote

    from django.conf import settings

    db = settings.DATABASES["default"]
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgresql://{auth}{'@' if auth else ''}{host}{port}/{quote(db['NAME'], safe='')}"


def raw_connect(*, autocommit: bool = True) -> Any:
    import psycopg

    return psycopg.connect(conninfo(), autocommit=autocommit)


def vendor() -> str:
    """The bench database's vendor: ``"postgresql"`` or ``"mysql"`` (MariaDB)."""
    from django.db import connection

    return connection.vendor


def postgresql() -> bool:
    """Whether the bench runs on PostgreSQL (the peers and the raw-SQL floor need it)."""
    return vendor() == "postgresql"


def ensure_database() -> None:
    """Create the bench database if missing and apply every migration."""
    from django.conf import settings
    from django.core.management import call_command

    db = settings.DATABASES["default"]
    name = db["NAME"]
    if postgresql():
        import psycopg

        with psycopg.connect(conninfo("postgres"), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    else:  # MariaDB
        import MySQLdb

        conn = MySQLdb.connect(host=db["HOST"], port=int(db["PORT"] or 3306), user=db["USER"],
                               passwd=db["PASSWORD"])
        try:
            conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` "
                                  f"CHARACTER SET utf8mb4")
        finally:
            conn.close()
    call_command("migrate", verbosity=0)


def server_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        if postgresql():
            with raw_connect() as conn:
                out["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
            out["database"] = f"PostgreSQL {out['postgresql']}"
        else:
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("SELECT VERSION()")
                out["database"] = f"{connection.display_name} {cursor.fetchone()[0]}"
    except Exception as exc:  # the report still says why
        out["database"] = f"unavailable ({exc})"
    try:
        import redis
        from django.conf import settings

        out["redis"] = redis.Redis.from_url(settings.REDIS_URL).info("server")["redis_version"]
    except Exception as exc:
        out["redis"] = f"unavailable ({type(exc).__name__})"
    return out


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare figures: CPU, RAM, load, service and library versions."""
    import django

    cpu_model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = None
    try:
        import psutil

        ram_gb = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    versions = {}
    for dist in ("django-jobguard", "django-tasks", "django-tasks-db", "procrastinate",
                 "celery", "pgqueuer", "asyncpg", "psycopg", "redis"):
        try:
            from importlib.metadata import version

            versions[dist] = version(dist)
        except Exception:
            versions[dist] = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "ram_gb": ram_gb,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        **server_versions(),
        "packages": versions,
        "taken_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def truncate(*tables: str) -> None:
    if not postgresql():
        from django.db import connection

        existing = set(connection.introspection.table_names())
        with connection.cursor() as cursor:
            for table in tables:
                if table in existing:
                    cursor.execute(f"TRUNCATE TABLE {connection.ops.quote_name(table)}")
        return
    with raw_connect() as conn:
        existing = [t for t in tables if conn.execute("SELECT to_regclass(%s)", [t]).fetchone()[0]]
        if existing:
            conn.execute(f"TRUNCATE {', '.join(existing)}")
        conn.execute("VACUUM ANALYZE") if existing else None


def count(sql: str, params: Sequence[Any] = ()) -> int:
    if not postgresql():
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()[0]
    with raw_connect() as conn:
        return conn.execute(sql, params).fetchone()[0]


# -- processes -------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "testproject"),
                                         env.get("PYTHONPATH", "")])
    env["PGAPPNAME"] = APP_NAME
    env.update(extra)
    return env


def spawn(argv: Sequence[str], *, count: int = 1, env: dict[str, str] | None = None,
          capture: bool = False) -> list[subprocess.Popen]:
    """Start ``count`` copies of ``argv`` (output discarded unless ``capture``)."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    return [subprocess.Popen(list(argv), env=env or child_env(), cwd=ROOT, stdout=out,
                             stderr=subprocess.STDOUT if capture else subprocess.DEVNULL,
                             text=True)
            for _ in range(count)]


def django_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args]


def stop(procs: Iterable[subprocess.Popen], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL whatever is still running after ``timeout``."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def worker_connections(min_per_process: int = 1) -> int:
    return count("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                 "AND datname = current_database()", [APP_NAME])


def wait_for_connections(expected: int, procs: Sequence[subprocess.Popen],
                         timeout: float = 60) -> None:
    """Wait until the workers opened ``expected`` connections (they are up and idle)."""
    def ready() -> bool:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"worker {proc.args} exited with {proc.returncode}")
        return worker_connections() >= expected

    wait_for(ready, timeout=timeout, interval=0.05, what=f"{expected} worker connections")


class Poller:
    """One open connection that asks the same question until the answer is 0."""

    def __init__(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.sql, self.params = sql, params
        # MariaDB: this thread's Django connection (autocommit: each poll sees fresh rows).
        self.conn = raw_connect() if postgresql() else None

    def value(self) -> int:
        if self.conn is None:
            return count(self.sql, self.params)
        return self.conn.execute(self.sql, self.params).fetchone()[0]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class CpuMeter:
    """CPU time (utime + stime, psutil) used over a measurement by the worker processes (each
    spawned process and its children, e.g. jobguard's watchdog, celery's pool) and by the
    PostgreSQL backends serving them (``application_name`` :data:`APP_NAME`), plus any
    ``extra_pids`` (celery's Redis server), counted as the queue store's.

    Processes are sampled a few times a second, so a backend or child that starts during the
    measurement counts from its start; one that exits loses at most the last interval.
    Reading another user's ``/proc/<pid>/stat`` (PostgreSQL's backends) needs the same user
    or root: without access, :meth:`result` gives ``None`` for the store.
    """

    INTERVAL = 0.25

    def __init__(self, procs: Sequence[subprocess.Popen], *,
                 extra_pids: Sequence[int] = ()) -> None:
        self.procs, self.extra_pids = list(procs), list(extra_pids)
        self.conn = raw_connect() if postgresql() else None
        # pid -> [cpu seconds at the start (0 if it started later), latest cpu seconds]
        self.workers: dict[int, list[float]] = {}
        self.store: dict[int, list[float]] = {}
        self.denied = False
        self.last = 0.0

    @staticmethod
    def _cpu(pid: int) -> float | None:
        import psutil

        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            return None
        return times.user + times.system

    def _worker_pids(self) -> list[int]:
        import psutil

        pids = []
        for proc in self.procs:
            try:
                parent = psutil.Process(proc.pid)
                pids += [parent.pid, *(c.pid for c in parent.children(recursive=True))]
            except psutil.NoSuchProcess:
                continue
        return pids

    def _store_pids(self) -> list[int]:
        pids = list(self.extra_pids)
        if self.conn is not None:
            pids += [r[0] for r in self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                "AND datname = current_database()", [APP_NAME]).fetchall()]
        return pids

    def _record(self, seen: dict[int, list[float]], pids: list[int], first: bool) -> None:
        import psutil

        for pid in pids:
            try:
                cpu = self._cpu(pid)
            except psutil.AccessDenied:
                self.denied = True
                continue
            if cpu is None:
                continue
            if pid in seen:
                seen[pid][1] = cpu
            else:
                seen[pid] = [cpu if first else 0.0, cpu]

    def sample(self, *, first: bool = False, force: bool = False) -> None:
        """Record every process's CPU time (at most every :attr:`INTERVAL` unless forced)."""
        now = time.monotonic()
        if not force and now - self.last < self.INTERVAL:
            return
        self.last = now
        self._record(self.workers, self._worker_pids(), first)
        self._record(self.store, self._store_pids(), first)

    def begin(self) -> None:
        self.sample(first=True, force=True)

    def result(self) -> tuple[float, float | None]:
        """(worker CPU seconds, queue store CPU seconds or None) since :meth:`begin`."""
        self.sample(force=True)
        workers = sum(last - start for start, last in self.workers.values())
        store = sum(last - start for start, last in self.store.values())
        return workers, (None if self.denied else store)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


@dataclass
class Run:
    """One processing measurement: ``jobs`` drained by ``processes`` workers in ``seconds``;
    with a :class:`CpuMeter`, the CPU seconds the workers and the queue store used."""

    tool: str
    processes: int
    jobs: int
    seconds: float
    worker_cpu: float | None = None
    store_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def worker_ms_per_job(self) -> float | None:
        return None if self.worker_cpu is None else self.worker_cpu * 1000 / self.jobs

    @property
    def store_ms_per_job(self) -> float | None:
        return None if self.store_cpu is None else self.store_cpu * 1000 / self.jobs


def measure_processing(*, tool: str, processes: int, jobs: int,
                       start: Callable[[], list[subprocess.Popen]],
                       ready: Callable[[list[subprocess.Popen]], None],
                       fill: Callable[[int], None], remaining_sql: str = "",
                       remaining: Callable[[], int] | None = None,
                       timeout: float = 600, cpu: bool = False,
                       store_pids: Sequence[int] = ()) -> Run:
    """Start idle workers, make ``jobs`` jobs visible at once (``fill`` commits them in one
    transaction), and time until ``remaining_sql`` (or ``remaining()``) counts 0. With
    ``cpu``, also the CPU the workers and their PostgreSQL backends (and ``store_pids``) used
    from just before the fill to the end (:class:`CpuMeter`)."""
    procs = start()
    poller = Poller(remaining_sql) if remaining_sql else None
    left = poller.value if poller else remaining
    assert left is not None, "give remaining_sql or remaining"
    meter: CpuMeter | None = None
    try:
        ready(procs)
        if cpu:
            meter = CpuMeter(procs, extra_pids=store_pids)
            meter.begin()

        def remaining_now() -> int:
            if meter is not None:
                meter.sample()
            return left()

        fill(jobs)
        t0 = time.perf_counter()
        t1 = wait_until_done(remaining_now, jobs, since=t0, timeout=timeout, what=f"{tool} done")
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{tool} worker exited early with {proc.returncode}")
        worker_cpu, store_cpu = meter.result() if meter else (None, None)
        return Run(tool=tool, processes=processes, jobs=jobs, seconds=t1 - t0,
                   worker_cpu=worker_cpu, store_cpu=store_cpu)
    finally:
        if poller:
            poller.close()
        if meter:
            meter.close()
        stop(procs)


def wait_until_done(remaining: Callable[[], int], jobs: int, *, since: float, timeout: float,
                    what: str) -> float:
    """``time.perf_counter()`` at the first ``remaining()`` that says 0 (``jobs`` were left at
    ``since``). Asked less often while many are left: at the rate between the last two
    answers, again once about half the time the rest needs has passed (at least 2 ms, at most
    0.1 s later, so that :class:`CpuMeter`, sampled at each answer, still samples a few times
    a second; 0.05 s while no rate is known), so the end is seen within a few ms. A count
    asked every 10 ms scanned every row left each time (8-9 ms at 50,000 rows on the 2-core
    machine): most of a core taken from the tool measured, which cut PgQueuer's batch 100
    from 15,900 to 7,000 jobs/s between 30,000 and 50,000 jobs."""
    deadline = since + timeout
    before: tuple[float, int] | None = None  # the answer before: when, and how many left
    while True:
        left = remaining()
        now = time.perf_counter()
        if left == 0:
            return now
        if now > deadline:
            raise WaitTimeout(f"timed out after {timeout} s waiting for {what} ({left} left)")
        pause = 0.05
        if before is not None and 0 < left < before[1] and now > before[0]:
            rate = (before[1] - left) / (now - before[0])
            pause = min(0.1, max(0.002, 0.5 * left / rate))
        before = (now, left)
        time.sleep(pause)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1]


def print_report(report: Report) -> None:
    """Print a scenario's tables, notes and goals (``bench/run.py`` and each scenario run on
    its own)."""
    for table in report.tables:
        print("\n" + render(table))
    for note in report.notes:
        print(f"note: {note}")
    for goal in report.goals:
        mark = {True: "met", False: "MISSED", None: "n/a"}[goal.met]
        print(f"goal: {goal.goal}: {goal.value} [{mark}]")


def save(report: Report, info: dict[str, Any], *, smoke: bool) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    on = "" if postgresql() else f"-{vendor()}"
    path = RESULTS / f"{report.name}{on}{'-smoke' if smoke else ''}.json"
    path.write_text(json.dumps({"machine": info, "smoke": smoke, **report.to_json()},
                               indent=2, default=str) + "\n")
    return path
