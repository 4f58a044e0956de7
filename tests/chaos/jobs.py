"""Jobs for the fault-injection tests (worker subprocesses load them via
JOBGUARD_EXTRA_JOB_MODULES=tests.chaos.jobs)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from demo.models import JobRun
from django.db.models import F
from django.utils import timezone

from django_jobguard import Job, ShouldBeUnique, WithoutOverlapping
from django_jobguard.stores import get_store
from tests.support.waiting import await_gate, wait_for_gate


class TakeLock(Job):
    """Tries to take ``key`` for ``ttl`` seconds in the default store; records what happened
    and the clock of the worker process (skewed in the clock-skew tests)."""

    def __init__(self, key: str, ttl: float):
        self.key, self.ttl = key, ttl

    def handle(self):
        token = get_store().acquire(self.key, f"job:{self.job_id}", ttl=self.ttl,
                                    job_id=self.job_id or "")
        JobRun.objects.create(label="acquired" if token is not None else "refused",
                              key=self.key, job_id=self.job_id or "", token=token,
                              started_at=timezone.now())


class UniqueRecord(ShouldBeUnique, Job):
    """A unique job (one per ``key``, lock in the default store) that records its runs; with
    ``gate`` it waits for that file first, with no time limit (held, it must not time out)."""

    tries = 5

    def __init__(self, key: str, gate: str = ""):
        self.key, self.gate = key, gate
        if gate:
            self.timeout = 0

    def unique_id(self) -> str:
        return self.key

    def handle(self):
        run = JobRun.objects.create(label="unique", key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    started_at=timezone.now())
        if self.gate:
            wait_for_gate(self.gate)
        time.sleep(0.01)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])


class OverlapRecord(Job):
    """One run at a time per ``key`` (``WithoutOverlapping`` in the default store, one try).

    Each run records itself (label ``overlap``, its fencing token, start and end), then makes
    a fenced write: the ``fence`` row of its key takes the run's token only if that is larger
    than the token already there; a refused write is recorded as ``fence-refused``. With
    ``hold`` the run keeps its lock until the test creates the ``go`` row of its key.
    """

    tries = 1

    def __init__(self, key: str, hold: bool = False, expire_after: float = 8.0):
        self.key, self.hold, self.expire_after = key, hold, expire_after

    def middleware(self):
        return [WithoutOverlapping(self.key, expire_after=self.expire_after, release_after=0.3)]

    def handle(self):
        run = JobRun.objects.create(label="overlap", key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    token=self.lock_token, started_at=timezone.now())
        if self.hold:
            deadline = time.monotonic() + 50
            while (not JobRun.objects.filter(label="go", key=self.key).exists()
                   and time.monotonic() < deadline):
                time.sleep(0.05)
        else:
            time.sleep(0.05)
        written = JobRun.objects.filter(label="fence", key=self.key,
                                        token__lt=self.lock_token).update(token=self.lock_token)
        if not written:
            JobRun.objects.create(label="fence-refused", key=self.key, job_id=self.job_id or "",
                                  token=self.lock_token, started_at=timezone.now())
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])


class GuardedRecord(ShouldBeUnique, Job):
    """A unique job (one per ``index``) that also runs ``WithoutOverlapping`` on the shared
    key ``index % keys``, and records each run: pid, attempt, overlap key, fencing token and
    start/end by the host clock (taken inside ``handle()``, so each run's interval lies within
    the time its worker held the overlap lock). For tests/chaos/test_kill_workers_locks.py.

    ``unique_for`` bounds a unique lock whose worker died between the ack and the release;
    ``OVERLAP_TTL`` bounds an overlap lock whose worker died mid-run. ``renew=True`` keeps a
    live worker's overlap lock from expiring under it on a loaded machine, so a live holder is
    never overlapped; only a dead holder's lock runs out.
    """

    LABEL = "guarded"
    OVERLAP_TTL = 4.0  # seconds: WithoutOverlapping(expire_after=...)
    tries = 3
    unique_for = 30

    def __init__(self, index: int, keys: int, seconds: float = 0.005):
        self.index, self.keys, self.seconds = index, keys, seconds

    def unique_id(self) -> str:
        return str(self.index)

    @property
    def overlap_key(self) -> str:
        return f"chaos-guarded:{self.index % self.keys}"

    def middleware(self):
        return [WithoutOverlapping(self.overlap_key, shared=True, release_after=0.2,
                                   expire_after=self.OVERLAP_TTL, renew=True)]

    def handle(self):
        run = JobRun.objects.create(label=self.LABEL, key=self.overlap_key,
                                    job_id=self.job_id or "", pid=os.getpid(),
                                    attempt=self.attempts(), token=self.lock_token,
                                    started_at=timezone.now())
        time.sleep(self.seconds)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])

    def failed(self, exception):
        """Record which worker failed the job for good. It calls this after it released the
        unique lock, so a job with this record must not hold its lock any more."""
        JobRun.objects.create(label=f"{self.LABEL}-failed", key=self.overlap_key,
                              job_id=self.job_id or "", pid=os.getpid(),
                              attempt=self.attempts(), started_at=timezone.now())


class GuardedRecordOnce(GuardedRecord):
    """The same with ``tries = 1``: a run cut short by a kill ends in failed jobs
    (``MaxAttemptsExceededError``) instead of running again."""

    tries = 1


class EndsTheProcess(Job):
    """Job code that tries to end its worker: ``sys.exit(0)``, ``os._exit(0)`` or a
    ``KeyboardInterrupt`` raised by the job itself (issue 12 item 1)."""

    tries = 1

    def __init__(self, how: str):
        self.how = how

    def handle(self):
        JobRun.objects.create(label="ends", key=self.how, job_id=self.job_id or "",
                              pid=os.getpid(), started_at=timezone.now())
        if self.how == "sys.exit":
            sys.exit(0)
        if self.how == "os._exit":
            os._exit(0)
        raise KeyboardInterrupt


class AsyncUniqueRecord(ShouldBeUnique, Job):
    """:class:`UniqueRecord` as an async job (``--async-concurrency``): a unique job whose
    run records itself through the async ORM (``gate`` as there)."""

    tries = 5

    def __init__(self, key: str, gate: str = ""):
        self.key, self.gate = key, gate
        if gate:
            self.timeout = 0

    def unique_id(self) -> str:
        return self.key

    async def handle(self):
        run = await JobRun.objects.acreate(label="async-unique", key=self.key,
                                           job_id=self.job_id or "", pid=os.getpid(),
                                           attempt=self.attempts(), started_at=timezone.now())
        if self.gate:
            await await_gate(self.gate)
        await asyncio.sleep(0.01)
        run.ended_at = timezone.now()
        await run.asave(update_fields=["ended_at"])


class AsyncUntimed(Job):
    """An async job without a time limit (``timeout = 0``) that awaits the ``gate`` file
    (when given), then ``seconds``, between recording its start and its end: the
    lease-takeover test stops its worker meanwhile."""

    timeout = 0
    tries = 3

    def __init__(self, label: str, seconds: float, gate: str = ""):
        self.label, self.seconds, self.gate = label, seconds, gate

    async def handle(self):
        run = await JobRun.objects.acreate(label=self.label, job_id=self.job_id or "",
                                           pid=os.getpid(), attempt=self.attempts(),
                                           started_at=timezone.now())
        if self.gate:
            await await_gate(self.gate)
        await asyncio.sleep(self.seconds)
        run.ended_at = timezone.now()
        await run.asave(update_fields=["ended_at"])


class SecondRunWaits(Job):
    """Records its run like ``tests.support.jobs.Record``; a run that is not the first of its
    process (of its ``label``) waits for the ``gate`` file first, so the test finds every
    process on its second job, the rest of its batch claimed ahead, however slow it looks.
    No time limit: a held run must not time out and let the worker go on."""

    timeout = 0

    def __init__(self, label: str, key: str, gate: str, seconds: float = 0.0):
        self.label, self.key, self.gate, self.seconds = label, key, gate, seconds

    def handle(self):
        run = JobRun.objects.create(label=self.label, key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    started_at=timezone.now())
        if JobRun.objects.filter(label=self.label, pid=os.getpid()).count() > 1:
            wait_for_gate(self.gate)
        time.sleep(self.seconds)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])


class RecordOrDie(Job):
    """Records its run like ``tests.support.jobs.Record``; with ``die`` it then kills its own
    worker (SIGKILL: no clean-up, no ack), as an OOM kill or a crash in C code would. It
    waits for the ``gate`` file (when given) before its ``seconds``."""

    tries = 1
    timeout = 0  # no time limit (the chaos settings give jobs 1 s)

    def __init__(self, key: str, die: bool = False, seconds: float = 0.0, gate: str = ""):
        self.key, self.die, self.seconds, self.gate = key, die, seconds, gate

    def handle(self):
        run = JobRun.objects.create(label="completion", key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    started_at=timezone.now())
        if self.die:
            os.kill(os.getpid(), 9)
        if self.gate:
            wait_for_gate(self.gate)
        if self.seconds:
            time.sleep(self.seconds)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])


class PartitionRecord(Job):
    """For tests/chaos/test_partition.py: one run at a time per ``key`` (``WithoutOverlapping``
    with ``renew``, shared key), and a resource the lock guards, fenced by the lock's token.

    The resource is the ``fence`` row of the key (the test creates it with token 0): a run
    *registers* its token there as it starts (the row takes it unless a newer holder's token
    came first) and *commits* there as it ends (the counter in ``attempt`` goes up by one, only
    while the row still holds a token no newer than the run's). A refused write is recorded as
    ``fence-refused`` (``pid``, ``token``, the stage in ``key``) and the run stops. A run
    records itself as ``partition`` (pid, attempt, token, start), and its end only once its
    commit was accepted. It reports progress at the start and just before its commit (``<pid>
    started`` / ``<pid> finishing``: more than a second apart for a held run, since progress
    is written at most once a second).

    With ``hold`` a run waits, up to a minute, for a ``go`` row of its job and its process
    (``key`` = job id, ``pid``) before it ends. No time limit (``timeout = 0``): a run cut off
    by a partition goes on once it heals, as a paused process would.
    """

    LABEL = "partition"
    OVERLAP_TTL = 3.0  # WithoutOverlapping(expire_after=...), renewed every second
    tries = 5
    timeout = 0

    def __init__(self, key: str, hold: bool = False):
        self.key, self.hold = key, hold

    def middleware(self):
        return [WithoutOverlapping(f"partition:{self.key}", shared=True, release_after=0.2,
                                   expire_after=self.OVERLAP_TTL, renew=True)]

    def _fenced(self, count: int) -> bool:
        return bool(JobRun.objects.filter(label="fence", key=self.key,
                                          token__lte=self.lock_token).update(
            token=self.lock_token, attempt=F("attempt") + count))

    def _refused(self, stage: str) -> None:
        JobRun.objects.create(label="fence-refused", key=stage, job_id=self.job_id or "",
                              pid=os.getpid(), attempt=self.attempts(), token=self.lock_token,
                              started_at=timezone.now())

    def handle(self):
        pid = os.getpid()
        run = JobRun.objects.create(label=self.LABEL, key=self.key, job_id=self.job_id or "",
                                    pid=pid, attempt=self.attempts(), token=self.lock_token,
                                    started_at=timezone.now())
        if not self._fenced(0):
            return self._refused("start")
        self.progress(0.1, f"{pid} started")
        if self.hold:
            deadline = time.monotonic() + 60
            while (not JobRun.objects.filter(label="go", key=self.job_id, pid=pid).exists()
                   and time.monotonic() < deadline):
                time.sleep(0.1)
        else:
            time.sleep(0.05)
        self.progress(0.9, f"{pid} finishing")
        if not self._fenced(1):
            return self._refused("end")
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])
        return None


class RerunWaits(Job):
    """Records its run (label ``rerun-waits``); with ``hold``, a run after the first (the row
    taken over from a stalled worker) waits up to a minute for a ``go`` row of its job before
    it ends, so the test can act while the second owner holds the row. With ``gate``, each
    run waits for that file before its ``seconds``. No time limit."""

    LABEL = "rerun-waits"
    tries = 3
    timeout = 0

    def __init__(self, key: str, seconds: float = 0.0, hold: bool = False, gate: str = ""):
        self.key, self.seconds, self.hold, self.gate = key, seconds, hold, gate

    def handle(self):
        waits = self.hold and JobRun.objects.filter(label=self.LABEL,
                                                    job_id=self.job_id).exists()
        run = JobRun.objects.create(label=self.LABEL, key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    started_at=timezone.now())
        if self.gate:
            wait_for_gate(self.gate)
        deadline = time.monotonic() + (60 if waits else self.seconds)
        while time.monotonic() < deadline and not (
                waits and JobRun.objects.filter(label="go", key=self.job_id).exists()):
            time.sleep(0.05)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])


class AsyncRerunWaits(RerunWaits):
    """:class:`RerunWaits` as an async job (``--async-concurrency``)."""

    async def handle(self):
        waits = await JobRun.objects.filter(label=self.LABEL, job_id=self.job_id).aexists() \
            if self.hold else False
        run = await JobRun.objects.acreate(label=self.LABEL, key=self.key,
                                           job_id=self.job_id or "", pid=os.getpid(),
                                           attempt=self.attempts(), started_at=timezone.now())
        if self.gate:
            await await_gate(self.gate)
        deadline = time.monotonic() + (60 if waits else self.seconds)
        while time.monotonic() < deadline and not (
                waits and await JobRun.objects.filter(label="go", key=self.job_id).aexists()):
            await asyncio.sleep(0.05)
        run.ended_at = timezone.now()
        await run.asave(update_fields=["ended_at"])
