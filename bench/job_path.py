"""The worker's Python per no-op job, in one process, without the database: what a change to
the job's path saves, measured to a microsecond where the burn-down's jobs/s swing by 15-25 %
between neighbouring runs on a shared machine.

``python bench/job_path.py [--jobs N] [--rounds R]`` times, in rounds of N jobs (claims of
100 rows, as the worker's), the three parts of a batched no-op job that run in Python:

- **rows**: building the claimed rows from their column values (the claim thread's share
  after the statement: :func:`~django_jobguard.dialects.base.job_from_values`);
- **job path**: :meth:`Pipeline.process` of each row, as the solo worker with
  ``COMPLETION_WINDOW`` runs it (``-v 0``): start deferred to the group, rebuild, time limit,
  middleware and ``handle()``, the ack joined to the group;
- **acked**: the group's write without its statement, and what it does for each row once
  the statement committed (the unique lock's release, ``job_processed``, the job line, the
  counts).

The group is a real :class:`~django_jobguard.worker.completer.Completer` whose dialect
writes nothing (every row acked) and whose window (1,000 s) never comes: each claim's group
is written by :meth:`~django_jobguard.worker.completer.Completer.flush`. It prints CPU
microseconds a job for each part and round, and the least of the rounds: compare two trees
by running each in turn (interleaved), never against a figure from another machine. The
database statements, the loop, the claim and completion threads' hand-overs are not in it:
``bench/run.py --only peers`` measures the whole worker.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

CLAIM = 100  # rows a claim brings, as a backlog's


class Unwritten:
    """The group's dialect, writing nothing: every row of a group is acked (still held)."""

    def complete(self, done, starts, reserved_by, *, relaxed=False):
        return {job_id for job_id, _ in done}, {job_id for job_id, _ in starts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs a round (20,000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    parser.add_argument("--async", dest="is_async", action="store_true",
                        help="async no-op jobs, each run by Pipeline.aprocess() on the "
                             "worker's event loop (one after another)")
    args = parser.parse_args(argv)
    common.setup_django()
    from django.utils import timezone

    from bench.jobs import AsyncNoop, Noop
    from django_jobguard import aio
    from django_jobguard.dialects import base
    from django_jobguard.models import QueuedJob
    from django_jobguard.worker.completer import Completer
    from django_jobguard.worker.pipeline import GROUPED, Pipeline

    using = "default"
    job_class = AsyncNoop if args.is_async else Noop
    template = QueuedJob(queue="bench", name=job_class.name, payload={}, attempts=0,
                         available_at=timezone.now(), created_at=timezone.now())
    columns = [field.attname for field in QueuedJob._meta.concrete_fields]  # the claim's
    values = [template.__dict__.get(name) for name in columns]
    values[base.PAYLOAD_INDEX] = '{"args": [], "kwargs": {}}'  # as the claim reads it
    id_index = columns.index("id")

    def claimed() -> list[list]:
        return [[*values[:id_index], uuid.uuid4(), *values[id_index + 1:]]
                for _ in range(CLAIM)]

    pipeline = Pipeline(worker_id="bench", using=using, event_loop=True, log_running=False)
    group = Completer(worker_id="bench", using=using, window=1000.0, batch_size=10**9,
                      dialect=Unwritten())
    group.ran(job_class.name, 0.0)  # a fast class: each start waits for the group
    pipeline.completer = group
    async def on_loop(rows: list) -> list[str]:
        return [await pipeline.aprocess(row) for row in rows]

    def run(rows: list) -> list[str]:
        if args.is_async:  # (the loop's thread runs them: process_time() counts every thread)
            return aio.loop_thread().run(on_loop(rows))
        return [pipeline.process(row) for row in rows]

    logging.disable(logging.CRITICAL)
    gc.collect()
    gc.freeze()  # as the worker does once loaded
    rounds = []
    for _ in range(args.rounds):
        claims = [claimed() for _ in range(args.jobs // CLAIM)]
        rows_s = path_s = acked_s = 0.0
        for claim in claims:
            t0 = time.process_time()
            plain = base.plain_rows()
            rows = [base.job_from_values(using, v, plain=plain) for v in claim]
            held_until = time.monotonic() + 90  # as the claim sets it (RETRY_AFTER)
            for row in rows:  # claimed ahead, as a backlog's rows are
                row.recovered, row.attempt_counted, row.held_until = False, False, held_until
            t1 = time.process_time()
            states = run(rows)
            t2 = time.process_time()
            if set(states) != {GROUPED}:
                raise SystemExit(f"jobs ended {set(states)}, not in the group: not a no-op run")
            group.flush()
            t3 = time.process_time()
            rows_s += t1 - t0
            path_s += t2 - t1
            acked_s += t3 - t2
        n = len(claims) * CLAIM
        rounds.append((rows_s / n * 1e6, path_s / n * 1e6, acked_s / n * 1e6))
    for name, index in (("rows", 0), ("job path", 1), ("acked", 2)):
        each = " ".join(f"{r[index]:.2f}" for r in rounds)
        print(f"{name:9} µs a job: least {min(r[index] for r in rounds):.2f} (rounds: {each})")
    print(f"{'total':9} µs a job: least {min(sum(r) for r in rounds):.2f}")
    sys.stdout.flush()
    os._exit(0)  # the group's timer thread waits for its window: no need to wait for it


if __name__ == "__main__":
    sys.exit(main())
