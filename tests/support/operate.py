"""Helpers for the admin and API tests: users, jobs in each state, and stores whose throttle
listing is fixed test data (the real listing comes with the limits feature)."""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import Iterator
from typing import ClassVar

from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.utils import timezone

from django_jobguard import Job, ShouldBeUnique, queue
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob, Worker
from django_jobguard.stores import ThrottleInfo
from django_jobguard.stores.database import DatabaseStore
from django_jobguard.stores.redis import RedisStore


class UniqueReport(ShouldBeUnique, Job):
    """A unique job (one per ``report_id``) for cancel / dispatch tests."""

    name = "tests.operate.UniqueReport"

    def __init__(self, report_id: int, title: str = "") -> None:
        self.report_id, self.title = report_id, title

    def unique_id(self) -> str:
        return str(self.report_id)

    def handle(self) -> None:
        pass


class Typed(Job):
    name = "tests.operate.Typed"

    def __init__(self, count: int, ratio: float = 1.0, label: str | None = None,
                 tags: list | None = None) -> None:
        self.count, self.ratio, self.label, self.tags = count, ratio, label, tags

    def handle(self) -> None:
        pass


class StaticThrottles:
    """Mixin: ``throttles()`` / ``reset_throttle()`` over a class-level list of rows."""

    rows: ClassVar[list[ThrottleInfo]] = []

    def throttles(self, prefix: str = "jobguard:") -> list[ThrottleInfo]:
        return [row for row in type(self).rows if row.key.startswith(prefix)]

    def reset_throttle(self, key: str) -> bool:
        before = len(type(self).rows)
        type(self).rows[:] = [row for row in type(self).rows if row.key != key]
        return len(type(self).rows) < before


class StaticThrottlesDatabaseStore(StaticThrottles, DatabaseStore):
    pass


class StaticThrottlesRedisStore(StaticThrottles, RedisStore):
    pass


STATIC_BACKENDS = {
    "database": "tests.support.operate.StaticThrottlesDatabaseStore",
    "redis": "tests.support.operate.StaticThrottlesRedisStore",
}


def throttle_rows(alias: str) -> list[ThrottleInfo]:
    """One rate-limit window and one open circuit, resetting in the future."""
    soon = timezone.now() + datetime.timedelta(seconds=40)
    return [
        ThrottleInfo(key="jobguard:rate:api:user:7", kind="rate", hits=3, limit=5,
                     resets_at=soon, store=alias),
        ThrottleInfo(key="jobguard:circuit:demo.jobs.SyncProfile", kind="circuit", hits=10,
                     limit=10, state="open", resets_at=soon, store=alias),
    ]


def corrupt_throttles(alias: str) -> list[str]:
    """Write a rate window and a circuit whose stored state cannot be decoded into store
    ``alias`` (bad stored data); returns their keys."""
    from django_jobguard import get_store
    from django_jobguard.models import Throttle

    keys = ["jobguard:rate:corrupt", "jobguard:circuit:corrupt"]
    if alias == "redis":
        client = get_store("redis").client
        client.set(keys[0], "rate|5|60000000|{not json")
        client.set(keys[1], "circuit|3|60000000|{not json")
    else:
        Throttle.objects.create(key=keys[0], kind="rate", limit=5, value=60.0,
                                data="{not json")
        Throttle.objects.create(key=keys[1], kind="circuit", limit=3, value=60.0,
                                data="{not json")
    return keys


def user_with(username: str, *codenames: str, staff: bool = True) -> User:
    """A user (password ``pw``) holding jobguard model permissions ``codenames``."""
    user = User.objects.create_user(username, password="pw", is_staff=staff)
    perms = Permission.objects.filter(content_type__app_label="django_jobguard",
                                      codename__in=codenames)
    assert perms.count() == len(codenames), codenames
    user.user_permissions.set(perms)
    return user


def waiting(name: str = "tests.support.jobs.Noop", queue_name: str = "default",
            **payload) -> QueuedJob:
    return QueuedJob.objects.create(name=name, queue=queue_name,
                                    payload={"args": [], "kwargs": {}, **payload})


def delayed(name: str = "tests.support.jobs.Noop", queue_name: str = "default") -> QueuedJob:
    return QueuedJob.objects.create(
        name=name, queue=queue_name, payload={"args": [], "kwargs": {}},
        available_at=timezone.now() + datetime.timedelta(hours=1))


def reserved(name: str = "tests.support.jobs.Noop", queue_name: str = "busy", *,
             worker_id: str = "host:1:abc", live: bool = True) -> QueuedJob:
    """A job claimed by ``worker_id`` through the real claim query (alone in its queue)."""
    QueuedJob.objects.create(name=name, queue=queue_name, payload={"args": [], "kwargs": {}})
    if live:
        Worker.objects.update_or_create(id=worker_id, defaults={
            "hostname": "host", "pid": 1, "queues": queue_name})
    [row] = queue.claim([queue_name], worker_id=worker_id)
    return row


@contextlib.contextmanager
def static_throttles(alias: str) -> Iterator[list[ThrottleInfo]]:
    """Make store ``alias`` (the default store) list :func:`throttle_rows` as its throttles."""
    from django_jobguard import stores

    config = {**jobguard_settings.STORES[alias], "BACKEND": STATIC_BACKENDS[alias]}
    settings = {**jobguard_settings.user_settings, "STORE": alias,
                "STORES": {**jobguard_settings.user_settings.get("STORES", {}), alias: config}}
    StaticThrottles.rows = throttle_rows(alias)
    try:
        with override_settings(JOBGUARD=settings):
            stores.reset()
            yield StaticThrottles.rows
    finally:
        StaticThrottles.rows = []


def failed_job_row(name: str = "tests.support.jobs.Boom", queue_name: str = "default"):
    from django_jobguard.models import FailedJob

    return FailedJob.objects.create(
        name=name, queue=queue_name, payload={"args": ["x"], "kwargs": {}}, attempts=3,
        exception_class="builtins.RuntimeError", message="boom",
        traceback="Traceback (most recent call last):\nRuntimeError: boom\n")


# -- the REST API -------------------------------------------------------------------------

API = "/jobguard/api/"
DISPATCHABLE = ["demo.jobs.SyncProfile", "demo.jobs.send_welcome_email",
                "tests.operate.UniqueReport", "tests.operate.Typed"]

#: One request per endpoint and method (safe to send without data: ids no row has, empty
#: bodies). The ids are fixed, not random, so that every pytest-xdist worker collects the
#: same test ids.
_NO_JOB, _NO_FAILED = uuid.UUID(int=1), uuid.UUID(int=2)
ENDPOINTS = [
    ("get", "jobs/"), ("get", f"jobs/{_NO_JOB}/"), ("delete", f"jobs/{_NO_JOB}/"),
    ("get", "failed-jobs/"), ("get", f"failed-jobs/{_NO_FAILED}/"),
    ("delete", f"failed-jobs/{_NO_FAILED}/"), ("post", f"failed-jobs/{_NO_FAILED}/retry/"),
    ("post", "failed-jobs/retry-all/"), ("get", "locks/"), ("get", "locks/jobguard:x/"),
    ("delete", "locks/jobguard:x/"), ("get", "throttles/"), ("get", "throttles/jobguard:x/"),
    ("delete", "throttles/jobguard:x/"), ("get", "stats/"), ("get", "stats/history/"),
    ("get", "schedules/"),
    ("post", "dispatch/"),
    ("get", "schema/"), ("get", "queues/paused/"), ("post", "queues/default/pause/"),
    ("post", "queues/default/resume/"), ("post", f"jobs/{_NO_JOB}/cancel/"),
    ("post", "failed-jobs/retry/"), ("post", "failed-jobs/delete/"), ("post", "jobs/delete/"),
    ("post", f"jobs/{_NO_JOB}/requeue/"),
    ("get", "runs/"), ("get", "runs/1/"), ("get", "runs/statistics/"),
    ("get", "workers/"), ("get", "workers/nohost:1:x/"), ("post", "workers/nohost:1:x/quiet/"),
    ("post", "workers/nohost:1:x/stop/"), ("post", "schedules/no-such-schedule/run/"),
]


def failed_job(name: str = "tests.support.jobs.Boom", queue_name: str = "default") -> FailedJob:
    return FailedJob.objects.create(
        name=name, queue=queue_name, payload={"args": ["x"], "kwargs": {}}, attempts=3,
        exception_class="builtins.RuntimeError", message="boom",
        traceback="Traceback (most recent call last):\nRuntimeError: boom\n")


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    if code:
        assert body["code"] == code, body
    return body
