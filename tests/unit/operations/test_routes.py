"""The three routes agree: the admin, the REST API and the management commands each act
through the operations layer, and the audit line names who acted."""

from __future__ import annotations

import json
import logging
from io import StringIO
from unittest import mock

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.management import call_command
from rest_framework.test import APIClient

from django_jobguard import operations
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from tests.support import expire
from tests.support.operate import failed_job_row, waiting

pytestmark = pytest.mark.django_db

API = "/jobguard/api/"
ADMIN = "/admin/django_jobguard/"


@pytest.fixture
def api(admin_user) -> APIClient:
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


@pytest.fixture
def audit(caplog):
    caplog.set_level(logging.WARNING, logger="django_jobguard.operations")
    return lambda: [r for r in caplog.records if r.name == "django_jobguard.operations"]


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def spy(name: str):
    """Patch ``operations.<name>`` with a wrapper that records its calls."""
    return mock.patch.object(operations, name, wraps=getattr(operations, name))


def admin_action(client, model: str, action: str, ids, **extra):
    return client.post(f"{ADMIN}{model}/", {"action": action,
                                            ACTION_CHECKBOX_NAME: [str(i) for i in ids],
                                            **extra}, follow=True)


# Each route: (how to call it, the actor its audit line names).
#: Routes that act on "all that match" call the bulk function of the operations layer.
BULK = {"retry": "retry_matching", "forget": "forget_matching", "cancel": "delete_matching"}

RETRY_ROUTES = {
    "admin": (lambda c, a, row: admin_action(c, "failedjob", "retry", [row.id], post="yes"),
              "admin"),
    "api": (lambda c, a, row: a.post(f"{API}failed-jobs/{row.id}/retry/"), "admin"),
    "api-all": (lambda c, a, row: a.post(f"{API}failed-jobs/retry-all/"), "admin"),
    "command": (lambda c, a, row: command("jobs_retry", str(row.id)), "manage.py jobs_retry"),
}


@pytest.mark.parametrize("route", RETRY_ROUTES)
def test_retry_goes_through_operations_on_every_route(route, admin_client, api, audit):
    row = failed_job_row()
    call, actor = RETRY_ROUTES[route]
    with spy(BULK["retry"] if route == "admin" else "retry") as retry:
        call(admin_client, api, row)
    assert retry.call_count == 1 and retry.call_args.kwargs["actor"] == actor
    assert QueuedJob.objects.get(id=row.id).attempts == 0 and not FailedJob.objects.exists()
    assert [(r.operation, r.count, r.actor) for r in audit()] == [("retry", 1, actor)]


FORGET_ROUTES = {
    "admin": (lambda c, a, row: admin_action(c, "failedjob", "delete_selected", [row.id],
                                             post="yes"), "admin"),
    "admin-page": (lambda c, a, row: c.post(f"{ADMIN}failedjob/{row.id}/delete/",
                                            {"post": "yes"}), "admin"),
    "api": (lambda c, a, row: a.delete(f"{API}failed-jobs/{row.id}/"), "admin"),
    "command": (lambda c, a, row: command("jobs_forget", str(row.id)), "manage.py jobs_forget"),
}


@pytest.mark.parametrize("route", FORGET_ROUTES)
def test_forget_goes_through_operations_on_every_route(route, admin_client, api, audit):
    row = failed_job_row()
    call, actor = FORGET_ROUTES[route]
    with spy(BULK["forget"] if route == "admin" else "forget") as forget:
        call(admin_client, api, row)
    assert forget.call_count == 1 and forget.call_args.kwargs["actor"] == actor
    assert not FailedJob.objects.exists()
    assert [(r.operation, r.count, r.actor) for r in audit()] == [("forget", 1, actor)]


CANCEL_ROUTES = {
    "admin": lambda c, a, row: admin_action(c, "queuedjob", "delete_selected", [row.id],
                                            post="yes"),
    "admin-page": lambda c, a, row: c.post(f"{ADMIN}queuedjob/{row.id}/delete/",
                                           {"post": "yes"}),
    "api": lambda c, a, row: a.delete(f"{API}jobs/{row.id}/"),
}


@pytest.mark.parametrize("route", CANCEL_ROUTES)
def test_cancel_goes_through_operations_on_every_route(route, admin_client, api, audit):
    row = waiting()
    with spy(BULK["cancel"] if route == "admin" else "cancel") as cancel:
        CANCEL_ROUTES[route](admin_client, api, row)
    assert cancel.call_count == 1 and cancel.call_args.kwargs["actor"] == "admin"
    assert not QueuedJob.objects.exists()
    assert [(r.operation, r.count, r.actor) for r in audit()] == [("cancel", 1, "admin")]


RELEASE_ROUTES = {
    "admin": (lambda c, a, key, alias: c.post(f"{ADMIN}lock/release/",
                                              {"key": key, "store": alias}), "admin"),
    "api": (lambda c, a, key, alias: a.delete(f"{API}locks/{key}/?store={alias}"), "admin"),
    "command": (lambda c, a, key, alias: command("jobs_locks", "--store", alias, "--release",
                                                 key), "manage.py jobs_locks"),
}


@pytest.mark.parametrize("route", RELEASE_ROUTES)
def test_force_release_goes_through_operations_on_every_route(route, store_alias, admin_client,
                                                              api, audit):
    """``jobs_locks --release`` used to call the store directly and skip the audit log."""
    store = get_store(store_alias)
    key = "jobguard:overlap:routes"
    assert store.acquire(key, "holder", ttl=60)
    call, actor = RELEASE_ROUTES[route]
    with spy("force_release") as release:
        call(admin_client, api, key, store_alias)
    assert release.call_count == 1 and release.call_args.kwargs["actor"] == actor
    assert store.get_lock(key) is None
    [record] = audit()
    assert (record.operation, record.count, record.actor) == ("force_release", 1, actor)
    assert record.getMessage() == (f"Lock {key} in store {store_alias} force-released by "
                                   f"{actor}.")


RESET_ROUTES = {
    "admin": lambda c, a, key, alias: c.post(f"{ADMIN}throttle/reset/",
                                             {"key": key, "store": alias}),
    "api": lambda c, a, key, alias: a.delete(f"{API}throttles/{key}/?store={alias}"),
}


@pytest.mark.parametrize("route", RESET_ROUTES)
def test_reset_throttle_goes_through_operations_on_every_route(route, store_alias,
                                                               admin_client, api, audit):
    store = get_store(store_alias)
    key = "jobguard:circuit:routes"
    store.circuit_leave(key, owner="x", outcome="failure", max_attempts=1, decay=30)
    with spy("reset_throttle") as reset:
        RESET_ROUTES[route](admin_client, api, key, store_alias)
    assert reset.call_count == 1 and reset.call_args.kwargs["actor"] == "admin"
    assert store.throttles() == []
    assert [(r.operation, r.actor) for r in audit()] == [("reset_throttle", "admin")]


def test_jobs_locks_clean_goes_through_operations(audit):
    store = get_store("database")
    store.acquire("jobguard:overlap:gone", "o", ttl=60)
    expire(store, "jobguard:overlap:gone")
    with spy("clean_locks") as clean:
        out = command("jobs_locks", "--store", "database", "--clean")
    assert clean.call_count == 1 and "Removed 1 expired lock(s)." in out
    assert [(r.operation, r.count, r.actor) for r in audit()] == [
        ("clean_locks", 1, "manage.py jobs_locks")]


@pytest.mark.parametrize("name, args, operation, actor", [
    ("jobs_clear", [], "clear", "manage.py jobs_clear"),
    ("jobs_flush", [], "flush", "manage.py jobs_flush"),
    ("jobs_prune_failed", ["--hours", "0"], "prune_failed", "manage.py jobs_prune_failed"),
])
def test_the_other_destructive_commands_go_through_operations(name, args, operation, actor,
                                                              audit):
    waiting()
    failed_job_row()
    with spy(operation) as called:
        command(name, *args)
    assert called.call_count == 1 and called.call_args.kwargs["actor"] == actor
    assert [(r.operation, r.count, r.actor) for r in audit()] == [(operation, 1, actor)]


def test_stats_and_monitor_count_queues_the_same_way(api):
    waiting()
    failed_job_row(queue_name="default")
    with spy("stats") as stats, spy("monitor") as monitor:
        over_api = api.get(f"{API}stats/").json()["queues"]
        [monitored] = json.loads(command("jobs_monitor", "--json", "--allow-unserved"))
    assert stats.call_count == 1 and monitor.call_count == 1
    assert over_api == {"default": {"waiting": 1, "delayed": 0, "reserved": 0, "failed": 1}}
    assert {k: monitored[k] for k in ("waiting", "delayed", "reserved", "failed")} == \
        over_api["default"]
