"""Jobs for the lock tests; worker subprocesses import this module through tests.settings.

Every run writes a ``JobRun`` row (label, key, pid, attempt, fencing token, start, end), and
every deferral or release of these jobs writes one labelled ``released:<reason>``, so tests
in this process can see what worker processes did.
"""

from __future__ import annotations

import os
import time

from demo.models import JobRun, Profile
from django.utils import timezone

from django_jobguard import (
    Job,
    ShouldBeUnique,
    ShouldBeUniqueUntilProcessing,
    WithoutOverlapping,
    signals,
)

# What in-process tests inspect besides JobRun rows.
EVENTS: list[tuple] = []


def record(job: Job, label: str, key: str = "", seconds: float = 0.0) -> JobRun:
    run = JobRun.objects.create(label=label, key=key, job_id=job.job_id or "", pid=os.getpid(),
                                attempt=job.attempts(), token=job.lock_token,
                                started_at=timezone.now())
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
    """WithoutOverlapping(key) with the options given; records its run and token."""

    tries = 1

    def __init__(self, key: str, label: str = "overlap", seconds: float = 0.0,
                 expire_after: float = 30, release_after: float = 0, shared: bool = False,
                 dont_release: bool = False, renew: bool = False, outcome: str = "ok"):
        self.key, self.label, self.seconds = key, label, seconds
        self.options = {"expire_after": expire_after, "release_after": release_after,
                        "shared": shared, "dont_release": dont_release, "renew": renew}
        self.outcome = outcome

    def middleware(self):
        return [WithoutOverlapping(self.key, **self.options)]

    def handle(self):
        run = record(self, self.label, self.key, self.seconds)
        EVENTS.append((self.label, self.key, self.lock_token))
        if self.outcome == "raise":
            raise RuntimeError("boom")
        return run.pk


class OtherOverlap(Overlap):
    """A second job class, for shared and non-shared keys across classes."""


class UniqueOverlap(ShouldBeUnique, Overlap):
    """Unique (per key) and WithoutOverlapping on the same key."""

    def unique_id(self) -> str:
        return self.key


def _on_released(sender, job=None, reason="", **kwargs):
    if isinstance(job, (Overlap, UniqueRecord, UntilProcessing)):
        key = getattr(job, "key", "")
        JobRun.objects.create(label=f"released:{reason}", key=key, job_id=job.job_id or "",
                              pid=os.getpid(), attempt=job.attempts(), started_at=timezone.now())


signals.job_released.connect(_on_released, dispatch_uid="tests.lock_jobs.released")
