"""Jobs used by the tests. Worker subprocesses import this module through tests.settings."""

from __future__ import annotations

import os
import time

from demo.models import JobRun, Profile
from django.utils import timezone

from django_jobguard import Job, job
from tests.support.waiting import wait_for_gate

# What in-process tests inspect (worker subprocesses record into JobRun instead).
CALLS: list[tuple] = []


class Record(Job):
    """Records one JobRun row per execution: label, key, pid, attempt, start and end; waits
    for the ``gate`` file first when one is given (see ``waiting.wait_for_gate``), with no
    time limit then: once ``gate_after`` runs of its label have ended (the jobs are claimed
    in any order: by id, a UUID, where their times tie)."""

    def __init__(self, label: str, key: str = "", seconds: float = 0.0, gate: str = "",
                 gate_after: int = 0):
        self.label, self.key, self.seconds, self.gate = label, key, seconds, gate
        self.gate_after = gate_after
        if gate:
            self.timeout = 0  # held at the gate, it must not time out while the test looks

    def handle(self):
        run = JobRun.objects.create(label=self.label, key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    token=self.lock_token, started_at=timezone.now())
        if self.gate and (not self.gate_after or JobRun.objects.filter(
                label=self.label, ended_at__isnull=False).count() >= self.gate_after):
            wait_for_gate(self.gate)
        if self.seconds:
            time.sleep(self.seconds)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])


class Noop(Job):
    def __init__(self, n: int = 0):
        self.n = n

    def handle(self):
        return self.n


class Boom(Job):
    """Raises every time."""

    tries = 3
    backoff = [30]  # tests call make_due() instead of waiting

    def __init__(self, message: str = "boom"):
        self.message = message

    def handle(self):
        CALLS.append(("boom", self.attempts()))
        raise RuntimeError(self.message)


class ReleaseMe(Job):
    tries = 2

    def handle(self):
        CALLS.append(("release", self.attempts()))
        self.release(0)


class DeferMe(Job):
    tries = 1

    def __init__(self, times: int):
        self.times = times

    def handle(self):
        CALLS.append(("defer", self.attempts()))
        if len([c for c in CALLS if c[0] == "defer"]) <= self.times:
            self.defer(0)


class FailMe(Job):
    tries = 5

    def handle(self):
        CALLS.append(("fail", self.attempts()))
        self.fail("no point retrying")


class Slow(Job):
    timeout = 1
    tries = 2
    backoff = 30

    def __init__(self, seconds: float = 5):
        self.seconds = seconds

    def handle(self):
        CALLS.append(("slow", self.attempts()))
        time.sleep(self.seconds)


class SyncProfileById(Job):
    delete_when_missing_models = False

    def __init__(self, profile: Profile):
        self.profile = profile

    def handle(self):
        CALLS.append(("profile", self.profile.pk))


class DropWhenMissing(SyncProfileById):
    delete_when_missing_models = True


@job(queue="functions", tries=2)
def add(a: int, b: int) -> int:
    CALLS.append(("add", a + b))
    return a + b


class Cooperative(Job):
    """Reports progress each step of ``seconds`` and stops when cancelled; one JobRun row
    (label, ended_at) records how it ended: ``key`` is ``cancelled`` or ``finished``."""

    def __init__(self, label: str, steps: int = 100, seconds: float = 0.1):
        self.label, self.steps, self.seconds = label, steps, seconds

    def handle(self):
        run = JobRun.objects.create(label=self.label, job_id=self.job_id or "",
                                    pid=os.getpid(), started_at=timezone.now())
        for step in range(self.steps):
            self.progress(step / self.steps, f"step {step} of {self.steps}")
            if self.cancelled:
                run.key = "cancelled"
                break
            time.sleep(self.seconds)
        else:
            run.key = "finished"
        run.ended_at = timezone.now()
        run.save(update_fields=["key", "ended_at"])


def context_seen() -> str:
    """``<language>|<correlation id>``: what a job sees of the dispatcher's context."""
    from django.utils import translation

    from django_jobguard.carriers import correlation_id

    return f"{translation.get_language()}|{correlation_id() or '-'}"


class ContextProbe(Job):
    """Records (JobRun: label, key) the language and correlation id it runs with, and
    dispatches ``children`` more generations of itself from inside its run."""

    def __init__(self, label: str, children: int = 0):
        self.label, self.children = label, children

    def handle(self):
        JobRun.objects.create(label=self.label, key=context_seen(), job_id=self.job_id or "",
                              pid=os.getpid(), started_at=timezone.now())
        if self.children:
            ContextProbe(f"{self.label}+", children=self.children - 1).dispatch()
