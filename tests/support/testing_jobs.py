"""Jobs for the tests of :mod:`django_jobguard.testing` (capture, drain, inline mode)."""

from __future__ import annotations

import datetime

from django_jobguard import (
    Job,
    Limit,
    RateLimited,
    ShouldBeUnique,
    ThrottlesExceptions,
    WithoutOverlapping,
    clock,
    job,
    rate_limiter,
)

#: What the jobs did, in order (in-process tests only).
RAN: list[tuple] = []


class SyncStock(Job):
    queue = "stock"

    def __init__(self, product_id: int):
        self.product_id = product_id

    def handle(self):
        RAN.append(("sync", self.product_id))
        return self.product_id


class PlaceOrder(Job):
    """Dispatches a SyncStock for each product (a job that dispatches jobs)."""

    def __init__(self, *product_ids: int, on_commit: bool = False):
        self.product_ids = product_ids
        self.on_commit = on_commit

    def handle(self):
        RAN.append(("order", self.product_ids))
        for product_id in self.product_ids:
            SyncStock(product_id).dispatch(on_commit=self.on_commit)


class Flaky(Job):
    """Fails its first ``failures`` runs, then succeeds."""

    tries = 3

    def __init__(self, failures: int = 1):
        self.failures = failures

    def handle(self):
        RAN.append(("flaky", self.attempts()))
        if self.attempts() <= self.failures:
            raise RuntimeError(f"attempt {self.attempts()} fails")


class Forever(Job):
    """Releases itself every run (a job drain() must not loop on for ever)."""

    tries = 0

    def handle(self):
        RAN.append(("forever", self.attempts()))
        self.release(0)


class UniqueReport(ShouldBeUnique, Job):
    def __init__(self, report_id: int):
        self.report_id = report_id

    def unique_id(self) -> str:
        return str(self.report_id)

    def handle(self):
        RAN.append(("report", self.report_id))
        # A copy dispatched while this one runs is not queued (the lock is still held).
        RAN.append(("copy queued", bool(UniqueReport(self.report_id).dispatch())))


@job(queue="mail")
def send_receipt(order_id: int, *, copy: bool = False) -> None:
    RAN.append(("receipt", order_id, copy))


# -- jobs for the test clock: one guard each, nothing that sleeps --------------------------------

rate_limiter.define("clock-five-a-minute", Limit.per_minute(5))

#: Whether the pretend gateway of CircuitJob is up.
GATEWAY = {"up": False}


class RateJob(Job):
    """At most five starts a minute."""

    def __init__(self, n: int):
        self.n = n

    def middleware(self):
        return [RateLimited("clock-five-a-minute")]

    def handle(self):
        RAN.append(("rate", self.n))


class OverlapJob(Job):
    """One at a time per key; waits 30 s when the key is taken; a lock lasts 60 s at most."""

    def __init__(self, key: str):
        self.key = key

    def middleware(self):
        return [WithoutOverlapping(self.key, release_after=30, expire_after=60)]

    def handle(self):
        RAN.append(("overlap", self.key))


class GatewayError(Exception):
    pass


class CircuitJob(Job):
    """Two gateway errors in a minute open the circuit for a minute; tries are unlimited."""

    tries = 0

    def __init__(self, n: int):
        self.n = n

    def middleware(self):
        return [ThrottlesExceptions(max_attempts=2, decay_seconds=60, by="clock-gateway")]

    def handle(self):
        RAN.append(("circuit", self.n, GATEWAY["up"]))
        if not GATEWAY["up"]:
            raise GatewayError("gateway down")


class UniqueForJob(ShouldBeUnique, Job):
    unique_for = 60

    def __init__(self, key: str):
        self.key = key

    def unique_id(self) -> str:
        return self.key

    def handle(self):
        RAN.append(("unique", self.key))


class BackoffJob(Job):
    """Fails twice with 60 then 120 seconds of backoff, then succeeds."""

    tries = 3
    backoff = [60, 120]

    def handle(self):
        RAN.append(("backoff", self.attempts()))
        if self.attempts() < 3:
            raise RuntimeError(f"attempt {self.attempts()}")


class DeadlineJob(Job):
    """Retries every minute until five minutes after its dispatch."""

    tries = 0
    backoff = 60

    def retry_until(self):
        return clock.now() + datetime.timedelta(minutes=5)

    def handle(self):
        RAN.append(("deadline", self.attempts()))
        raise RuntimeError("not yet")
