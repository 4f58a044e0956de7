"""Hosts and network partitions (issue 33): a worker host cut off from PostgreSQL and Redis in
the middle of a job, its lease passed to another host, then the network healed.

Each "host" is one ``jobworker`` process whose every connection, to PostgreSQL and to Redis,
goes through a TCP proxy of its own that the test controls (tests/support/netproxy.py). To cut
a host off, the test blackholes both its proxies: nothing crosses any more, in either
direction, and no connection is closed; the worker's queries, heartbeats and lock renewals just
hang (Redis calls time out after the client's ``SOCKET_TIMEOUT``). To heal, forwarding resumes,
and what the host sent into the partition reaches the servers late, as TCP delivers it once a
short partition heals. The hosts use the client settings docs/scale-out.md asks for across a
network (``connect_timeout``, ``statement_timeout``, ``idle_in_transaction_session_timeout``,
TCP keepalives and ``tcp_user_timeout``; the Redis ``SOCKET_TIMEOUT``); with the proxy the
connections stay alive at the TCP level, so the worker hangs until the heal, as a real one does
for as long as its kernel keeps retrying.

The jobs (``PartitionRecord`` in tests/chaos/jobs.py) run ``WithoutOverlapping`` on a shared
key (3 s, renewed every second) and write to a resource fenced by the lock's token: the
``fence`` row of their key, which takes a run's token at its start unless a newer one came
first, and counts the run's commit at its end only while it holds no newer token.

How the run goes, once per store (overlap locks in the database, then in Redis):

1. two hosts start; one held job (``hold``) is dispatched; the host that runs it is cut off
   while the job is inside ``handle()`` holding its overlap lock;
2. quick jobs on the held job's key and another are dispatched; the other host runs them, and
   once the lease (``RETRY_AFTER`` = 4 s) and the lock (3 s) ran out, the held job too, with a
   newer fencing token;
3. the cut host is healed while the other host still runs the held job: its run resumes and
   ends. Its commit is refused by the fence, its progress write by the owner check (the row's
   progress is still the other host's), its lock release by the owner check (the other host
   still holds the lock, with its own token), and its ack finds the row someone else's (LOST),
   so the count of the held job's batch (a batch of one) does not move;
4. the other host finishes.

That is one cut; a run makes two, the second one healed after the cut host's connections
were closed (what its client timeouts do to a partition that lasts longer): its run then ends
at its next query, before its commit, and the rest holds as in the first. Then the other host
is stopped, more jobs are dispatched, and the host cut last runs them all; then it is stopped
too (exit 0).

Asserted: the held job's lease passed (its second run is the other host's, with a newer token,
started after the cut); the late writes above were refused; every job has exactly one committed
run and nothing is left queued or failed; the committed runs of a key never overlap, their
tokens increase in start order, and the fence's counter equals their number; the healed host
worked on and stopped cleanly. The figures printed (``-s``) are those docs/guarantees.md quotes
from longer local runs (``JOBGUARD_PARTITION_ROUNDS``: several cuts in one run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

import pytest
from demo.models import JobRun
from django.db import connection
from django.utils import timezone

from django_jobguard import batch, dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.stores import get_store
from tests.chaos import jobs as chaos_jobs
from tests.chaos.conftest import chaos_env
from tests.support import MANAGE, REDIS_URL, ROOT, requires_postgres, requires_redis, wait_for
from tests.support.netproxy import NetProxy

pytestmark = [pytest.mark.chaos, pytest.mark.slow, requires_postgres, requires_redis,
              pytest.mark.django_db(transaction=True)]

Record = chaos_jobs.PartitionRecord
LABEL = Record.LABEL
KEYS = ("k0", "k1")
#: Cuts in one run (the held job's key and the mode alternate); a longer local run sets more.
ROUNDS = int(os.environ.get("JOBGUARD_PARTITION_ROUNDS", "2"))
MODES = ("late", "reset")

#: The lease and the heartbeat (every RETRY_AFTER / 3). 4 s, not the chaos default of 2 s: the
#: host that is not cut off must not lose its own lease on a loaded 2-core machine.
LEASE = {"JOBGUARD_RETRY_AFTER": "4", "JOBGUARD_DEFAULT_TIMEOUT": "2"}
#: What a worker reaching PostgreSQL across a network should set (docs/scale-out.md).
DB_OPTIONS = {
    "connect_timeout": 3,
    "options": "-c statement_timeout=10000 -c idle_in_transaction_session_timeout=10000",
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
    "tcp_user_timeout": 10000,
}
#: And to Redis (django-redis OPTIONS).
REDIS_OPTIONS = {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2}


@dataclass
class Host:
    """One worker process and the proxies its connections go through."""

    name: str
    proc: subprocess.Popen
    proxies: list[NetProxy]
    log: IO[str] = field(repr=False)
    cut_at: list = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def worker_id(self) -> str:
        return WorkerRow.objects.get(pid=self.pid).id

    def cut(self) -> None:
        self.cut_at.append(timezone.now())
        for proxy in self.proxies:
            proxy.blackhole()

    def heal(self) -> None:
        for proxy in self.proxies:
            proxy.heal()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self, timeout: float = 30) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"host {self.name} did not stop:\n{self.output()[-3000:]}")

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for proxy in self.proxies:
            proxy.close()
        self.log.close()


def _redis_upstream() -> tuple[str, int, int]:
    match = re.fullmatch(r"redis://([^/:]+)(?::(\d+))?(?:/(\d+))?/?", REDIS_URL)
    assert match, REDIS_URL
    return match.group(1), int(match.group(2) or 6379), int(match.group(3) or 0)


@pytest.fixture
def hosts(transactional_db) -> Iterator:
    """``hosts(name)`` starts a worker host (see :class:`Host`); all die with the test."""
    made: list[Host] = []

    def start(name: str) -> Host:
        settings = connection.settings_dict
        pg = NetProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432),
                      name=f"{name}-postgres").start()
        redis_host, redis_port, redis_db = _redis_upstream()
        redis = NetProxy(redis_host, redis_port, name=f"{name}-redis").start()
        env = chaos_env(**LEASE, JOBGUARD_TEST_DB_PORT=str(pg.port),
                        # (over the suite's own: prepare_threshold in one of .ci/run's)
                        JOBGUARD_TEST_DB_OPTIONS=json.dumps({**json.loads(os.environ.get(
                            "JOBGUARD_TEST_DB_OPTIONS") or "{}"), **DB_OPTIONS}),
                        JOBGUARD_REDIS_URL=f"redis://127.0.0.1:{redis.port}/{redis_db}",
                        JOBGUARD_TEST_REDIS_OPTIONS=json.dumps(REDIS_OPTIONS))
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in cleanup())
        proc = subprocess.Popen([sys.executable, str(MANAGE), "jobworker", "--sleep", "0.2"],
                                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                text=True)
        made.append(Host(name, proc, [pg, redis], log))
        return made[-1]

    yield start
    for host in made:
        host.cleanup()


def _wait(what: str, predicate, hosts: list[Host], timeout: float = 60):
    """``wait_for``, with the hosts' output when it times out or a host died."""
    def check():
        dead = [h.name for h in hosts if h.proc.poll() is not None]
        if dead:
            raise RuntimeError(f"hosts {dead} exited:\n" + _outputs(hosts))
        return predicate()

    try:
        return wait_for(check, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_outputs(hosts)}") from None


def _outputs(hosts: list[Host]) -> str:
    return "\n".join(f"--- {h.name} (pid {h.pid}):\n{h.output()[-4000:]}" for h in hosts)


def _run(job_id: str, **filters) -> JobRun | None:
    return JobRun.objects.filter(label=LABEL, job_id=job_id, **filters).order_by("id").first()


def _cut_round(both: list[Host], key: str, store, mode: str) -> tuple[Host, list[str], dict]:
    """One cut (steps 1 to 3 of the module docstring) on the held job's ``key``: returns the
    host that was cut off, the jobs dispatched and the round's figures. ``mode`` "late": the
    heal delivers what the cut host sent; "reset": its connections are closed first."""
    lock_key = Record(key).middleware()[0].lock_key(Record(key))
    # A batch of one: its counts are written in the statement of the member's ack, so a late
    # ack that is refused must count nothing.
    members = batch([Record(key, hold=True)], name="partition").dispatch()
    [held_id] = members.job_ids
    job_ids = [held_id]
    first = _wait("the held job runs", lambda: _run(held_id), both)
    # Cut between its two fenced writes. (Cut before the first, the run's registration is held
    # in the partition and refused as it arrives after the newer holder's: the same refusal.)
    _wait("the held run registered its token", lambda: JobRun.objects.filter(
        label="fence", key=key, token=first.token).exists(), both)
    cut = next(h for h in both if h.pid == first.pid)
    other = next(h for h in both if h is not cut)
    other_worker = other.worker_id
    assert store.get_lock(lock_key).token == first.token  # inside handle(), holding it

    held_before = sum(p.held_bytes for p in cut.proxies)
    cut.cut()
    during = dispatch_many([Record(KEYS[i % len(KEYS)]) for i in range(6)])
    job_ids += [h.id for h in during]
    second = _wait("the lease passes to the other host",
                   lambda: _run(held_id, pid=other.pid), both)
    passed_after = (second.started_at - cut.cut_at[-1]).total_seconds()
    assert second.token > first.token, (first.token, second.token)
    assert second.started_at > cut.cut_at[-1]
    assert QueuedJob.objects.get(id=held_id).reserved_by == other_worker

    JobRun.objects.create(label="go", key=held_id, pid=cut.pid, started_at=timezone.now())
    held_bytes = sum(p.held_bytes for p in cut.proxies) - held_before
    if mode == "reset":  # the partition outlasted the clients' timeouts: connections drop
        for proxy in cut.proxies:
            proxy.reset()
    cut.heal()
    healed_at = time.monotonic()
    # The cut host's run resumes and ends. "late": its commit reaches the fence and is refused,
    # then its lock release (owner-checked) and its ack (the row is the other host's: LOST).
    # "reset": its next query meets the closed connection, so the run ends before its commit;
    # the release and the outcome meet it too, or find the lock and the row someone else's.
    ended = re.compile(rf"\[{held_id}\] \.+ LOST|finishing \S+ \[{held_id}\]")
    _wait("the cut host's run ends", lambda: ended.search(cut.output()), both)
    ended_after_heal = time.monotonic() - healed_at
    refused = list(JobRun.objects.filter(label="fence-refused", job_id=held_id))
    if mode == "late":
        assert "LOST" in ended.search(cut.output()).group(0)
        assert [(r.pid, r.key, r.token) for r in refused] == [(cut.pid, "end", first.token)]
    else:
        assert refused == []
    assert _run(held_id, pid=cut.pid).ended_at is None  # its commit never counted
    lock = store.get_lock(lock_key)  # the late release left the other host's lock alone
    assert lock is not None and lock.token == second.token, (lock, second.token)
    row = QueuedJob.objects.get(id=held_id)  # the late progress write was refused
    assert (row.reserved_by, row.progress_message) == (other_worker,
                                                       f"{other.pid} started"), row
    members.refresh()  # the late ack counted nothing
    assert (members.pending_jobs, members.failed_jobs, members.finished_at) == (1, 0, None)
    assert cut.proc.poll() is None

    JobRun.objects.create(label="go", key=held_id, pid=other.pid, started_at=timezone.now())
    _wait("every job done", lambda: not QueuedJob.objects.exists(), both)
    # settled just after the ack, by the worker that made it
    _wait("the batch finished", lambda: members.refresh().finished_at, both)
    assert (members.pending_jobs, members.failed_jobs, members.total_jobs) == (0, 0, 1)
    return cut, job_ids, {"mode": mode, "held_bytes": held_bytes,
                          "passed_after_s": round(passed_after, 2),
                          "ended_after_heal_s": round(ended_after_heal, 2)}


def test_partitioned_host_loses_its_lease_and_its_late_writes_are_refused(hosts, store_alias):
    store = get_store()
    for key in KEYS:
        JobRun.objects.create(label="fence", key=key, token=0, attempt=0,
                              started_at=timezone.now())
    both = [hosts("one"), hosts("two")]
    _wait("both hosts registered", lambda: all(
        WorkerRow.objects.filter(pid=h.pid).exists() for h in both), both)
    job_ids: list[str] = []
    figures: list[dict] = []
    for round_ in range(ROUNDS):
        last, ids, round_figures = _cut_round(both, KEYS[round_ % len(KEYS)], store,
                                              MODES[round_ % len(MODES)])
        job_ids += ids
        figures.append(round_figures)

    # The healed host works on: with the other host stopped, it runs every job left.
    rest = next(h for h in both if h is not last)
    assert rest.stop() == 0, rest.output()[-3000:]
    after = dispatch_many([Record(KEYS[i % len(KEYS)]) for i in range(4)])
    job_ids += [h.id for h in after]
    _wait("the healed host runs the last jobs", lambda: not QueuedJob.objects.exists(), [last])
    assert {r.pid for r in JobRun.objects.filter(label=LABEL, job_id__in=[h.id for h in after],
                                                 ended_at__isnull=False)} == {last.pid}
    assert last.stop() == 0, last.output()[-3000:]

    # -- every job exactly once, nothing lost ------------------------------------------------
    assert not FailedJob.objects.exists(), list(FailedJob.objects.values("name", "message"))
    runs = list(JobRun.objects.filter(label=LABEL).order_by("started_at", "id"))
    committed: dict[str, list[JobRun]] = defaultdict(list)
    for run in runs:
        if run.ended_at is not None:
            committed[run.job_id].append(run)
    assert sorted(committed) == sorted(job_ids)
    assert all(len(v) == 1 for v in committed.values()), {
        k: [(r.pid, r.token) for r in v] for k, v in committed.items() if len(v) > 1}

    # -- overlap: committed runs of a key one at a time, tokens rising, counted once each -----
    by_key: dict[str, list[JobRun]] = defaultdict(list)
    for job_runs in committed.values():
        by_key[job_runs[0].key].extend(job_runs)
    for key, key_runs in by_key.items():
        key_runs.sort(key=lambda r: r.started_at)
        tokens = [r.token for r in key_runs]
        assert tokens == sorted(set(tokens)), (key, tokens)
        for before, after_ in zip(key_runs, key_runs[1:], strict=False):
            assert before.ended_at <= after_.started_at, (key, before.__dict__, after_.__dict__)
        fence = JobRun.objects.get(label="fence", key=key)
        assert fence.attempt == len(key_runs), (key, fence.attempt, len(key_runs))
    late = sum(f["mode"] == "late" for f in figures)
    assert JobRun.objects.filter(label="fence-refused").count() == late
    print(f"\n{store_alias}: {ROUNDS} cut(s), {len(job_ids)} jobs; " + "; ".join(
        f"{f['mode']}: lease passed {f['passed_after_s']} s after the cut, cut run ended "
        f"{f['ended_after_heal_s']} s after the heal, {f['held_bytes']} bytes held"
        for f in figures))
