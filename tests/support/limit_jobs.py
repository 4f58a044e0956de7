"""Jobs and limiters for the limits tests (worker subprocesses import this via tests.settings).

Every job that passes ``RateLimited`` records the store time at which it was admitted
(``JobRun.token``, microseconds since the epoch): the algorithm's guarantee is about those
admissions, which a process can only record after the fact (its ``started_at``).
"""

from __future__ import annotations

import os
import time

from demo.models import JobRun, Profile
from django.utils import timezone

from django_jobguard import Job, Limit, RateLimited, Skip, ThrottlesExceptions, rate_limiter
from django_jobguard.exceptions import JobTimeoutError

# What in-process tests inspect.
CALLS: list[tuple] = []

# -- limiters --------------------------------------------------------------------------------

rate_limiter.define("test-window", lambda job: Limit.per_second(5, decay_seconds=2).by(job.key))
rate_limiter.define("open-door", lambda job: Limit.none())
rate_limiter.define("gate", lambda job: Limit.per_minute(1).by(job.key))


@rate_limiter("per-user")
def per_user(job):
    return Limit.per_minute(2).by(job.key)


@rate_limiter("tenant")
def tenant(job):
    """A global limit and a per-tenant one: a start counts in both or in neither."""
    return [Limit.per_minute(100), Limit.per_minute(2).by(f"tenant-{job.key}")]


def _admitted_us(job: Job) -> int | None:
    at = job.rate_limit_admitted_at
    return int(at.timestamp() * 1_000_000) if at else None


class RateRecord(Job):
    """A JobRun row per run: label, key, pid, attempt, admission time (token), start, end."""

    limiter = "test-window"

    def __init__(self, label: str, key: str = "", seconds: float = 0.0):
        self.label, self.key, self.seconds = label, key, seconds

    def middleware(self):
        return [RateLimited(self.limiter)]

    def handle(self):
        started = timezone.now()
        CALLS.append((self.label, self.key, self.attempts()))
        run = JobRun.objects.create(label=self.label, key=self.key, job_id=self.job_id or "",
                                    pid=os.getpid(), attempt=self.attempts(),
                                    token=_admitted_us(self), started_at=started)
        if self.seconds:
            time.sleep(self.seconds)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])


class PerUser(RateRecord):
    limiter = "per-user"


class Unlimited(RateRecord):
    limiter = "open-door"


class PerTenant(RateRecord):
    limiter = "tenant"


class DropWhenFull(RateRecord):
    def middleware(self):
        return [RateLimited("per-user", dont_release=True)]


class ReleaseAfter(RateRecord):
    def middleware(self):
        return [RateLimited("per-user", release_after=42)]


class TwoTries(RateRecord):
    """Rate-limited on "gate" (1 per minute per key) with only two tries."""

    tries = 2
    limiter = "gate"


class FailsAfterAdmission(RateRecord):
    limiter = "gate"
    tries = 3

    def handle(self):
        super().handle()
        raise RuntimeError("failed after using its slot")


class UndefinedLimiter(RateRecord):
    limiter = "no-such-limiter"


class Skipper(Job):
    def __init__(self, mode: str, flag: bool):
        self.mode, self.flag = mode, flag

    def middleware(self):
        if self.mode == "when-bool":
            return [Skip.when(self.flag)]
        if self.mode == "unless-bool":
            return [Skip.unless(self.flag)]
        if self.mode == "when-job":
            return [Skip.when(lambda job: job.flag)]
        return [Skip.unless(lambda: self.flag)]

    def handle(self):
        CALLS.append(("skipper", self.mode, self.flag))


# -- circuit jobs ------------------------------------------------------------------------------


class GatewayDown(Exception):
    """The (pretend) SMS gateway is unavailable."""


class NotCounted(Exception):
    pass


class Gone(Exception):
    pass


def gateway_up() -> bool:
    return Profile.objects.filter(name="gateway", syncs=1).exists()


class GatewayA(Job):
    """Calls the gateway; fails while it is down. Shares circuit "gateway" with GatewayB."""

    tries = 20
    backoff = 0.0  # ThrottlesExceptions retries counted failures at once (its backoff=0)

    def __init__(self, label: str, seconds: float = 0.0):
        self.label, self.seconds = label, seconds

    def middleware(self):
        # 6 s: the tests check the circuit is open and holds GatewayB after the worker that
        # opened it has exited; with 3 s, a loaded machine (two suites side by side in CI)
        # could take that long to end the worker, and the circuit was half-open already.
        return [ThrottlesExceptions(max_attempts=5, decay_seconds=6).by("gateway")]

    def handle(self):
        up = gateway_up()
        run = JobRun.objects.create(label=self.label, key="ok" if up else "fail",
                                    job_id=self.job_id or "", pid=os.getpid(),
                                    attempt=self.attempts(), started_at=timezone.now())
        if self.seconds:
            time.sleep(self.seconds)
        run.ended_at = timezone.now()
        run.save(update_fields=["ended_at"])
        if not up:
            raise GatewayDown("gateway unavailable")


class GatewayB(GatewayA):
    """Another job class on the same circuit."""


class Flaky(Job):
    """In-process circuit tests: ``outcome`` says what handle() does this time."""

    tries = 10
    backoff = 30
    circuit: dict = {"max_attempts": 3, "decay_seconds": 60}
    outcomes: list[str] = []  # one per run: ok / fail / uncounted / gone / timeout / release

    def __init__(self, label: str = "flaky"):
        self.label = label

    def middleware(self):
        return [ThrottlesExceptions(**self.circuit)]

    def handle(self):
        outcome = type(self).outcomes.pop(0) if type(self).outcomes else "ok"
        CALLS.append((self.label, outcome, self.attempts()))
        if outcome == "fail":
            raise GatewayDown(f"{self.label} failed")
        if outcome == "uncounted":
            raise NotCounted("not for the circuit")
        if outcome == "gone":
            raise Gone("nothing to do any more")
        if outcome == "timeout":
            raise JobTimeoutError("pretend it hung")
        if outcome == "release":
            self.release(30)
        return outcome
