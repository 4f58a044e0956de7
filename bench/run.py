"""Run the benchmarks and print their tables:
``python bench/run.py [--smoke] [--only X,Y] [--database URL]``; the sizes of the peers'
burn-down and of the steady-rate scenario with ``--burn-jobs``, ``--rounds``,
``--processes``, ``--rates`` and ``--steady-seconds`` (see docs/benchmarks.md).

Each scenario is a module of ``bench/`` with ``run(*, smoke) -> Report``; results go to
``bench/results/<scenario>[-smoke].json`` together with a description of the machine
(``<scenario>-mysql[-smoke].json`` on MariaDB). Figures are only worth comparing when taken on
a quiet machine (see docs/benchmarks.md).

``--database`` (default ``JOBGUARD_BENCH_DATABASE_URL``, else PostgreSQL's ``jobguard_bench``)
chooses the database: ``postgres://...`` runs every scenario, ``mysql://...`` (MariaDB) those
that need no PostgreSQL (:data:`ANY_DATABASE`: the peers, the raw-SQL floor and the latency
and backlog probes are written for PostgreSQL).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

SCENARIOS = ["throughput", "peers", "latency", "steady", "backlog", "locks", "lock_pages",
             "batches", "dashboard", "io_bound", "memory", "wait_latency", "history",
             "fairness", "history_pages"]
#: The scenarios that run on MariaDB too (throughput without its PostgreSQL floor columns).
ANY_DATABASE = ["throughput", "locks"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true",
                        help="small sizes, a minute or two: checks that every scenario runs")
    parser.add_argument("--only", default="",
                        help=f"comma-separated scenarios (default all of {', '.join(SCENARIOS)})")
    parser.add_argument("--database", default="", metavar="URL",
                        help="postgres://... or mysql://... (MariaDB); default "
                             "JOBGUARD_BENCH_DATABASE_URL or postgres://127.0.0.1:5432/"
                             "jobguard_bench. Worker processes get it too.")
    sizing = parser.add_argument_group(
        "sizes of the peers and steady scenarios (also JOBGUARD_BENCH_<NAME> variables; "
        "--smoke uses its own small sizes)")
    sizing.add_argument("--burn-jobs", type=int, metavar="N",
                        help="peers: no-op jobs per burn-down (default 50000)")
    sizing.add_argument("--rounds", type=int, metavar="N",
                        help="peers: rounds per tool, the median is reported (default 3)")
    sizing.add_argument("--processes", metavar="1,2",
                        help="peers: worker process counts (default 1,2)")
    sizing.add_argument("--rates", metavar="R,R",
                        help="steady: offered jobs/s (default 200,1000)")
    sizing.add_argument("--steady-seconds", type=float, metavar="S",
                        help="steady: seconds each rate is offered (default 20)")
    args = parser.parse_args(argv)
    for option, name in (("burn_jobs", "BURN_JOBS"), ("rounds", "ROUNDS"),
                         ("processes", "PROCESSES"), ("rates", "RATES"),
                         ("steady_seconds", "STEADY_SECONDS")):
        value = getattr(args, option)
        if value is not None:
            os.environ[f"JOBGUARD_BENCH_{name}"] = str(value)  # the scenarios read these
    if args.database:
        if not args.database.startswith(("postgres://", "postgresql://", "mysql://",
                                          "mariadb://")):
            parser.error(f"--database {args.database!r}: give a postgres:// or mysql:// URL")
        os.environ["JOBGUARD_BENCH_DATABASE_URL"] = args.database  # before Django reads it
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or SCENARIOS
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")

    common.setup_django()
    common.ensure_database()
    info = common.machine()
    print(f"machine: {info['cpu_count']} x {info['cpu_model']}, {info['ram_gb']} GB RAM, "
          f"load {info['load_average']}; {info['database']}, Redis {info['redis']}; "
          f"Python {info['python']}, Django {info['django']}")
    failed = []
    for name in chosen:
        if not common.postgresql() and name not in ANY_DATABASE:
            print(f"\n[{name}] needs PostgreSQL, skipped on {common.vendor()}")
            continue
        if importlib.util.find_spec(f"bench.{name}") is None:
            print(f"\n[{name}] not present, skipped")
            continue
        module = importlib.import_module(f"bench.{name}")
        print(f"\n[{name}]", flush=True)
        started = time.monotonic()
        try:
            report = module.run(smoke=args.smoke)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        common.print_report(report)
        path = common.save(report, info, smoke=args.smoke)
        print(f"({time.monotonic() - started:.0f} s, written to {path.relative_to(common.ROOT)})")
    if failed:
        print(f"\nscenarios that failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
