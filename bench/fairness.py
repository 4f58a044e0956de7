"""Fair share across tenants (docs/scale-out.md#fair-share-across-tenants), on PostgreSQL.

1,000 tenants (smoke: 200) with Zipf-distributed backlogs (tenant ``r`` has
``ceil(top / r)`` no-op jobs, dispatched shuffled in one transaction) are drained by 2
``jobworker`` processes, once from a plain queue and once from the same queue made fair
(``JOBGUARD["QUEUES"]["bench"] = {"fair": True}``). Each job appends its tenant and the time
to a Redis list, so the served order is known without touching the database.

- Fairness: the served sequence is cut into windows of ``2 x tenants`` jobs; in each window
  Jain's index ``(sum x)^2 / (n * sum x^2)`` over the tenants that still had jobs waiting at
  the window's end (they wanted service all along), ``x`` being the jobs each got in it.
  Round robin gives each the same; the plain claim serves them in proportion to their backlog.
- Throughput: jobs/s from the first job served to the last, fair vs plain in the same run
  (the median of ``JOBGUARD_BENCH_FAIRNESS_ROUNDS`` alternating rounds, default 2; smoke: 1).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time

from bench.common import (
    Goal,
    Report,
    Table,
    child_env,
    count,
    django_command,
    knob,
    ratio,
    spawn,
    stop,
    truncate,
)
from bench.throughput import JOBGUARD_TABLES, REMAINING
from tests.support.waiting import wait_for

PROCESSES = 2


def sizes(smoke: bool) -> dict[str, int]:
    if smoke:
        return {"tenants": 200, "top": 100}   # 588 jobs
    return {"tenants": 1_000, "top": 1_500}   # 11,235 jobs


def backlogs(tenants: int, top: int) -> dict[str, int]:
    """Zipf (s = 1): the tenant of rank r has ``ceil(top / r)`` jobs."""
    return {f"tenant-{rank:04}": math.ceil(top / rank) for rank in range(1, tenants + 1)}


def fill(counts: dict[str, int]) -> None:
    """Queue every tenant's jobs, shuffled, in one transaction (visible at once)."""
    from django.db import transaction

    from bench.jobs import TenantStamp
    from django_jobguard import dispatch_many

    tenants = [tenant for tenant, n in counts.items() for _ in range(n)]
    random.Random(33).shuffle(tenants)
    with transaction.atomic():
        dispatch_many([TenantStamp(tenant) for tenant in tenants], batch_size=1000)


def served_order(fair: bool, counts: dict[str, int]) -> list[tuple[float, str]]:
    """Drain the backlog with :data:`PROCESSES` workers: ``(time, tenant)`` as served."""
    import redis
    from django.conf import settings

    from bench.jobs import SERVED_KEY

    store = redis.Redis.from_url(settings.REDIS_URL)
    store.delete(SERVED_KEY)
    truncate(*JOBGUARD_TABLES)
    fill(counts)
    queues = {"bench": {"fair": True}} if fair else {}
    argv = django_command("jobworker", "--queue", "bench", "--sleep", "0.2",
                          "--stop-when-empty")
    procs = spawn(argv, count=PROCESSES,
                  env=child_env(JOBGUARD_BENCH_QUEUES=json.dumps(queues)))
    total = sum(counts.values())
    try:
        wait_for(lambda: store.llen(SERVED_KEY) >= total, timeout=900, interval=0.5,
                 what=f"{total} jobs served")
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        stop(procs)
    served, runs = [], set()
    for item in store.lrange(SERVED_KEY, 0, -1):
        tenant, at, job_id = item.decode().split()
        served.append((float(at), tenant))
        runs.add(job_id)
    left = count(REMAINING)
    if left or len(runs) != len(served):
        raise RuntimeError(f"{len(served) - len(runs)} jobs ran twice, {left} were left in "
                           f"the queue ({'fair' if fair else 'plain'} claim)")
    store.delete(SERVED_KEY)
    truncate(*JOBGUARD_TABLES)
    served.sort()
    return served


def jain(shares: list[int]) -> float:
    """Jain's fairness index: 1 when all shares are equal, 1/n when one tenant has it all."""
    total, squares = sum(shares), sum(x * x for x in shares)
    return (total * total) / (len(shares) * squares) if squares else 1.0


def window_fairness(served: list[tuple[float, str]], counts: dict[str, int],
                    window: int) -> list[float]:
    """Jain's index of each full window of ``window`` served jobs, over the tenants that
    still had jobs waiting when the window ended."""
    left = dict(counts)
    indexes = []
    for start in range(0, len(served) - window + 1, window):
        got: dict[str, int] = {}
        for _, tenant in served[start:start + window]:
            got[tenant] = got.get(tenant, 0) + 1
            left[tenant] -= 1
        waiting = [tenant for tenant, n in left.items() if n > 0]
        if len(waiting) >= 2:
            indexes.append(jain([got.get(tenant, 0) for tenant in waiting]))
    return indexes


def rate(served: list[tuple[float, str]]) -> float:
    """Jobs/s from the first job served to the last."""
    seconds = served[-1][0] - served[0][0]
    return len(served) / seconds if seconds > 0 else float("nan")


def run(*, smoke: bool) -> Report:
    s = sizes(smoke)
    counts = backlogs(s["tenants"], s["top"])
    window = 2 * s["tenants"]
    rounds = 1 if smoke else int(knob("FAIRNESS_ROUNDS", 2))
    report = Report(name="fairness")
    measured: dict[str, list[dict]] = {"plain": [], "fair": []}
    for _ in range(rounds):  # alternating, so that a change of load hits both alike
        for fair in (False, True):
            started = time.monotonic()
            served = served_order(fair, counts)
            indexes = window_fairness(served, counts, window)
            measured["fair" if fair else "plain"].append({
                "jobs_per_second": rate(served),
                "window_rates": [rate(served[i:i + window])
                                 for i in range(0, len(served) - window + 1, window)],
                "jain_mean": sum(indexes) / len(indexes) if indexes else None,
                "jain_min": min(indexes) if indexes else None,
                "windows": len(indexes),
                "seconds": time.monotonic() - started,
            })
    results = {name: {
        "jobs_per_second": statistics.median(r["jobs_per_second"] for r in runs),
        "jain_mean": runs[-1]["jain_mean"],
        "jain_min": min((r["jain_min"] for r in runs if r["jain_min"] is not None),
                        default=None),
        "windows": runs[-1]["windows"],
        "rounds": runs,
    } for name, runs in measured.items()}
    plain, fair = results["plain"], results["fair"]
    report.tables.append(Table(
        title=(f"{s['tenants']:,} tenants, Zipf backlogs ({sum(counts.values()):,} no-op jobs, "
               f"largest {s['top']:,}), {PROCESSES} workers, median of {rounds} round(s); "
               f"Jain's index per {window:,}-job window"),
        columns=["claim", "jobs/s", "vs plain", "Jain mean", "Jain min", "windows"],
        rows=[["plain", plain["jobs_per_second"], 1.0, plain["jain_mean"], plain["jain_min"],
               plain["windows"]],
              ["fair", fair["jobs_per_second"],
               ratio(fair["jobs_per_second"], plain["jobs_per_second"]), fair["jain_mean"],
               fair["jain_min"], fair["windows"]]]))
    report.data.update(results, backlogs={"tenants": s["tenants"], "top": s["top"],
                                          "jobs": sum(counts.values()), "window": window})
    if fair["jain_min"] is None:
        report.goals.append(Goal("Jain's index >= 0.95 in every window", "no full window",
                                 None))
    else:
        report.goals.append(Goal("Jain's index >= 0.95 in every window (fair claim)",
                                 f"min {fair['jain_min']:.3f}", fair["jain_min"] >= 0.95))
    kept = ratio(fair["jobs_per_second"], plain["jobs_per_second"]) or 0
    report.goals.append(Goal("fair claim throughput >= 0.9x the plain claim", f"{kept:.2f}x",
                             None if smoke else kept >= 0.9))
    if smoke:
        report.notes.append("smoke sizes: the throughput goal is only judged at full size")
    return report
