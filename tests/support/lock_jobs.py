"""Jobs for the lock tests; worker subprocesses import this module through tests.settings.

Every run writes a ``JobRun`` row (label, key, pid, attempt, fencing token, start, end), and
every deferral or release of these jobs writes one labelled ``released:<reason>``, so tests
in this process can see what worker processes did.
"""

from __future__ import annotations

import datetime
import os
import time

from demo.models import JobRun, Profile
from django.utils import timezone

from django_jobguard import (
    Job,
    ShouldBeUnique,
    ShouldBeUniqueUntilProcessing,
    WithoutOverlapping,
    job,
    signals,
    unique,
    unique_until_processing,
    without_overlapping,
)
from django_jobguard.stores import get_store
from tests.support.waiting import wait_for_gate

# What in-process tests inspect besides JobRun rows.
EVENTS: list[tuple] = []


def record(job: Job, label: str, key: str = "", seconds: float = 0.0,
           gate: str = "") -> JobRun:
    run = JobRun.objects.create(label=label, key=key, job_id=job.job_id or "", pid=os.getpid(),
                                attempt=job.attempts(), token=job.lock_token,
                                started_at=timezone.now())
    if gate:
        wait_for_gate(gate)
    if seconds:
        time.sleep(seconds)
    run.ended_at = timezone.now()
    run.save(update_fields=["ended_at"])
    return run


class UniqueRecord(ShouldBeUnique, Job):
    """Unique per ``key``; ``outcome`` is "ok", "raise", "release", "fail" or "defer"."""

    tries = 3
    backoff = [30]

    def __init__(self, key: str = "", label: str = "unique", outcome: str = "ok",
                 seconds: float = 0.0):
        self.key, self.label, self.outcome, self.seconds = key, label, outcome, seconds

    def unique_id(self) -> str:
        return self.key

    def handle(self):
        record(self, self.label, self.key, self.seconds)
        EVENTS.append((self.label, self.outcome, self.attempts()))
        if self.outcome == "raise":
            raise RuntimeError("boom")
        if self.outcome == "release":
            self.release(0)
        elif self.outcome == "fail":
            self.fail("given up")
        elif self.outcome == "defer":
            self.defer(0)


class UniqueFor(UniqueRecord):
    """Unique with a ttl: the lock ends at ``unique_for`` even if nothing releases it."""

    unique_for = 3


class UniqueOnce(UniqueRecord):
    """Unique without a ttl, one try: crash recovery fails it at its next pop."""

    tries = 1


class UntilProcessing(ShouldBeUniqueUntilProcessing, Job):
    """Unique until a worker starts it; ``handle()`` tries to dispatch a copy of itself."""

    tries = 3
    backoff = [30]

    def __init__(self, key: str = "", outcome: str = "ok", overlap: str = ""):
        self.key, self.outcome, self.overlap = key, outcome, overlap

    def unique_id(self) -> str:
        return self.key

    def middleware(self):
        return [WithoutOverlapping(self.overlap, expire_after=60)] if self.overlap else []

    def handle(self):
        copy = UntilProcessing(self.key, outcome="ok").dispatch()
        EVENTS.append(("until", self.attempts(), bool(copy)))
        if self.outcome == "raise":
            raise RuntimeError("boom")


class UniqueProfile(ShouldBeUnique, Job):
    """Unique per job (one id for all profiles); takes a model argument."""

    def __init__(self, profile: Profile):
        self.profile = profile

    def handle(self):
        EVENTS.append(("profile", self.profile.pk))


class UniqueProfileDrop(UniqueProfile):
    delete_when_missing_models = True


class Overlap(Job):
    """WithoutOverlapping(key) with the options given; records its run and token (waiting for
    the ``gate`` file, when given, with no time limit)."""

    tries = 1

    def __init__(self, key: str, label: str = "overlap", seconds: float = 0.0,
                 expire_after: float = 30, release_after: float = 0, shared: bool = False,
                 dont_release: bool = False, renew: bool = False, outcome: str = "ok",
                 gate: str = ""):
        self.key, self.label, self.seconds, self.gate = key, label, seconds, gate
        self.options = {"expire_after": expire_after, "release_after": release_after,
                        "shared": shared, "dont_release": dont_release, "renew": renew}
        self.outcome = outcome
        if gate:
            self.timeout = 0  # held at the gate, it must not time out while the test looks

    def middleware(self):
        return [WithoutOverlapping(self.key, **self.options)]

    def handle(self):
        run = record(self, self.label, self.key, self.seconds, gate=self.gate)
        EVENTS.append((self.label, self.key, self.lock_token))
        if self.outcome == "raise":
            raise RuntimeError("boom")
        return run.pk


class OtherOverlap(Overlap):
    """A second job class, for shared and non-shared keys across classes."""


class WaitForPartner(Overlap):
    """Runs until a job labelled ``partner`` has started (or ``wait`` seconds passed) and
    records "saw-partner" or "alone" in its JobRun's key: proof of running side by side.
    With ``shared`` it also stops once the partner was deferred on the shared key (the
    ``released:overlap`` row): the partner cannot start while this one runs, and a fixed wait
    could end before a slow-starting second worker had tried it."""

    def __init__(self, key: str, label: str, partner: str, wait: float, shared: bool):
        super().__init__(key, label=label, shared=shared, expire_after=60, release_after=0.1)
        self.partner, self.wait = partner, wait

    def handle(self):
        run = JobRun.objects.create(label=self.label, job_id=self.job_id or "", pid=os.getpid(),
                                    token=self.lock_token, started_at=timezone.now())
        deadline = time.monotonic() + self.wait
        seen = False
        deferred = False
        while not seen and not deferred and time.monotonic() < deadline:
            seen = JobRun.objects.filter(label=self.partner).exists()
            deferred = (self.options["shared"]
                        and JobRun.objects.filter(label="released:overlap").exists())
            time.sleep(0.02)
        if deferred:  # past the partner's release_after (0.1 s), so that it is due again when
            time.sleep(0.5)  # this one ends: a --stop-when-empty worker would not wait for it
        run.key = "saw-partner" if seen else "alone"
        run.ended_at = timezone.now()
        run.save(update_fields=["key", "ended_at"])


class OtherWaitForPartner(WaitForPartner):
    """The same, as a second job class."""


class UniqueOverlap(ShouldBeUnique, Overlap):
    """Unique (per key) and WithoutOverlapping on the same key."""

    def unique_id(self) -> str:
        return self.key


class RenewProbe(Job):
    """Holds its overlap lock for a whole ``expire_after`` past the lock's first expiry and
    reports whether it still held it then ("held") or lost it on the way ("lost")."""

    def __init__(self, key: str, renew: bool, expire_after: float = 0.6):
        self.key, self.renew, self.expire_after = key, renew, expire_after

    def middleware(self):
        return [WithoutOverlapping(self.key, expire_after=self.expire_after, renew=self.renew)]

    def handle(self):
        store = get_store()
        key = f"jobguard:overlap:{self.name}:{self.key}"
        first = store.get_lock(key)
        deadline = first.expires_at + datetime.timedelta(seconds=self.expire_after)
        give_up = time.monotonic() + 20
        while time.monotonic() < give_up:
            info = store.get_lock(key)
            if info is None or info.owner != first.owner:
                EVENTS.append(("renew", "lost", first.owner))
                return
            if store.now() > deadline:
                EVENTS.append(("renew", "held", info.owner))
                return
            time.sleep(0.05)
        raise AssertionError("RenewProbe: neither lost nor past the deadline")


# Function jobs: the decorators above and below @job.

@unique(key=lambda user_id: user_id, unique_for=60)
@job
def sync_user(user_id: int) -> None:
    EVENTS.append(("sync_user", user_id))


@job(tries=2)
@unique_until_processing(key=lambda user_id: user_id)
def import_user(user_id: int) -> None:
    EVENTS.append(("import_user", user_id))


@without_overlapping(key=lambda invoice_id, **kw: f"inv:{invoice_id}", shared=True,
                     expire_after=30)
@job
def charge(invoice_id: int, label: str = "charge") -> None:
    EVENTS.append((label, invoice_id, charge.job_class.name))


@job
@without_overlapping(key=lambda invoice_id, **kw: f"inv:{invoice_id}", shared=True,
                     expire_after=30)
def refund(invoice_id: int, label: str = "refund") -> None:
    EVENTS.append((label, invoice_id))


@unique(key=lambda n: n)
@without_overlapping(key=lambda n: "all", expire_after=30, release_after=5)
@job(queue="default")
def unique_and_exclusive(n: int) -> None:
    EVENTS.append(("both", n))


def _on_released(sender, job=None, reason="", **kwargs):
    if isinstance(job, (Overlap, UniqueRecord, UntilProcessing)):
        key = getattr(job, "key", "")
        JobRun.objects.create(label=f"released:{reason}", key=key, job_id=job.job_id or "",
                              pid=os.getpid(), attempt=job.attempts(), started_at=timezone.now())


signals.job_released.connect(_on_released, dispatch_uid="tests.support.lock_jobs.released")
