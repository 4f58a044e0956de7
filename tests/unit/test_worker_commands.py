"""Quiet and stop a worker from the console (issue 31): the command is written to the
worker's row, its heartbeat reads it (within one beat, any host), owner- and
permission-checked in the operations layer, the admin and the API."""

from __future__ import annotations

import os
import socket

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from django_jobguard import operations
from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.worker import Worker, WorkerOptions
from tests.support import jobs
from tests.support.operate import API, assert_error, user_with

pytestmark = pytest.mark.django_db

WORKERS = "/admin/django_jobguard/worker/"


def live_row(worker_id: str = "") -> WorkerRow:
    """A worker row that counts as alive: this host, this (live) process, a fresh beat."""
    return WorkerRow.objects.create(id=worker_id or f"{socket.gethostname()}:{os.getpid()}:t1",
                                    hostname=socket.gethostname(), pid=os.getpid(),
                                    queues="default")


def gone_row() -> WorkerRow:
    return WorkerRow.objects.create(id="elsewhere:1:old", hostname="elsewhere", pid=1,
                                    queues="default", last_seen_at="2000-01-01T00:00:00Z")


def worker() -> Worker:
    return Worker(WorkerOptions(stop_when_empty=True, memory=0, sleep=0))


# -- the operations layer ------------------------------------------------------------------


def test_command_worker_writes_the_row_of_a_live_worker_only():
    row = live_row()
    assert operations.command_worker(row.id, "quiet", actor="ann") == "quiet"
    row.refresh_from_db()
    assert (row.command, row.command_by) == ("quiet", "ann") and row.command_at is not None
    assert operations.command_worker(row.id, "stop", actor="bob") == "stop"
    assert operations.command_worker(row.id, "quiet") == "stop"  # a quiet does not undo it
    row.refresh_from_db()
    assert (row.command, row.command_by) == ("stop", "bob")
    with pytest.raises(operations.WorkerGoneError, match="is gone"):
        operations.command_worker(gone_row().id, "stop")
    with pytest.raises(operations.WorkerNotFound, match="No worker"):
        operations.command_worker("nohost:2:none", "stop")
    with pytest.raises(ValueError, match="Unknown worker command"):
        operations.command_worker(row.id, "pause")


# -- the worker reads its row at each heartbeat ---------------------------------------------


def test_the_heartbeat_delivers_quiet_then_stop():
    w = worker()
    w._start()
    try:
        w.heartbeat()
        assert WorkerRow.objects.get(id=w.id).state == "running"
        operations.command_worker(w.id, "quiet")
        w.heartbeat()
        assert w.run_state == "quiet" and w.graceful.stopping() and not w._stop.is_set()
        assert WorkerRow.objects.get(id=w.id).state == "quiet"
        operations.command_worker(w.id, "stop")
        w.heartbeat()
        assert w._stop.is_set() and WorkerRow.objects.get(id=w.id).state == "stopping"
    finally:
        w._shutdown()


def test_a_quiet_worker_claims_nothing_and_gives_back_rows_claimed_ahead():
    job_id = jobs.Noop(1).dispatch().id
    w = worker()
    w.quiet()
    assert w.run() == 0  # --stop-when-empty: nothing claimed, so nothing to do
    row = QueuedJob.objects.get(id=job_id)
    assert (row.reserved_by, row.attempts) == ("", 0)


def test_a_job_sees_stopping_when_its_worker_is_quieted():
    """Quiet is a graceful stop: a cooperative job may hand itself back, attempt unused."""
    seen: list[bool] = []

    class Watch(jobs.Noop):
        name = "tests.commands.Watch"

        def handle(self):
            w.quiet()  # as the heartbeat would, while the job runs
            seen.append(self.stopping)

    Watch().dispatch()
    w = worker()
    assert w.run() == 0
    assert seen == [True]
    assert not QueuedJob.objects.exists()  # it finished: quiet cuts nothing off


# -- the admin ------------------------------------------------------------------------------


def test_the_workers_page_names_the_running_jobs_class_and_the_state(admin_client):
    job = jobs.Noop(1).dispatch()
    row = live_row()
    row.current_job = job.id
    row.state = "quiet"
    row.command, row.command_by = "quiet", "ann"
    row.save()
    page = admin_client.get(WORKERS).content.decode()
    assert "tests.support.jobs.Noop" in page and job.id[:8] in page
    assert "quiet" in page and "asked by ann" in page
    detail = admin_client.get(f"{WORKERS}{row.id}/change/").content.decode()
    assert "tests.support.jobs.Noop" in detail


def test_admin_actions_quiet_and_stop_need_their_permissions(client):
    row = live_row()
    viewer = user_with("viewer", "view_worker")
    client.force_login(viewer)
    page = client.get(WORKERS)
    assert "quiet_workers" not in page.content.decode()
    refused = client.post(WORKERS, {"action": "quiet_workers", "_selected_action": [row.id]})
    assert refused.status_code in (200, 302)
    row.refresh_from_db()
    assert row.command == ""
    quieter = user_with("quieter", "view_worker", "quiet_worker")
    client.force_login(quieter)
    page = client.get(WORKERS).content.decode()
    assert "quiet_workers" in page and "stop_workers" not in page
    client.post(WORKERS, {"action": "quiet_workers", "_selected_action": [row.id]})
    row.refresh_from_db()
    assert (row.command, row.command_by) == ("quiet", "quieter")


def test_admin_stop_action_reports_gone_workers(admin_client):
    live, gone = live_row(), gone_row()
    response = admin_client.post(WORKERS, {"action": "stop_workers",
                                           "_selected_action": [live.id, gone.id]},
                                 follow=True)
    text = response.content.decode()
    assert "1 worker was asked to stop" in text and f"Gone, left alone: {gone.id}" in text
    live.refresh_from_db()
    gone.refresh_from_db()
    assert (live.command, gone.command) == ("stop", "")


# -- the API --------------------------------------------------------------------------------


def test_api_lists_workers_with_their_running_jobs(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    job = jobs.Noop(1).dispatch()
    row = live_row()
    row.current_job = job.id
    row.save()
    body = client.get(API + "workers/").json()
    assert body["results"][0]["running"] == [{"id": job.id, "name": "tests.support.jobs.Noop"}]
    assert body["results"][0]["status"] == "alive"
    one = client.get(API + f"workers/{row.id}/").json()
    assert one["queues"] == ["default"] and one["state"] == "running"


def test_api_quiet_and_stop_are_permission_and_owner_checked():
    row, gone = live_row(), gone_row()
    client = APIClient()
    client.force_authenticate(user_with("viewer", "view_worker"))
    assert_error(client.post(API + f"workers/{row.id}/quiet/"), 403, "permission_denied")
    client.force_authenticate(user_with("quieter", "view_worker", "quiet_worker"))
    assert client.post(API + f"workers/{row.id}/quiet/").json() == {"id": row.id,
                                                                     "command": "quiet"}
    assert_error(client.post(API + f"workers/{row.id}/stop/"), 403, "permission_denied")
    client.force_authenticate(User.objects.create_superuser("root", password="pw"))
    assert client.post(API + f"workers/{row.id}/stop/").json()["command"] == "stop"
    assert client.post(API + f"workers/{row.id}/quiet/").json()["command"] == "stop"
    assert_error(client.post(API + f"workers/{gone.id}/stop/"), 409, "worker_gone")
    assert_error(client.post(API + "workers/nohost:1:x/stop/"), 404)


def test_a_worker_from_the_command_line_freezes_what_it_loaded_and_call_command_does_not(
        monkeypatch):
    """``manage.py jobworker`` owns its process: what Django loaded leaves the garbage
    collector's scans (``gc.freeze()``, after a collection). A ``call_command()`` in a test
    or a script must not freeze the caller's objects."""
    from django.core.management import call_command

    from django_jobguard.management.commands.jobworker import Command
    from django_jobguard.worker import loop

    calls = []
    monkeypatch.setattr(loop.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(loop.gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(loop.sys, "setswitchinterval", lambda seconds: calls.append(seconds))
    jobs.Noop(1).dispatch()
    call_command("jobworker", "--once", "--memory", "0", "-v", "0")
    assert calls == [] and QueuedJob.objects.count() == 0
    jobs.Noop(2).dispatch()
    from_command_line = Command()
    from_command_line._called_from_command_line = True  # as run_from_argv() sets it
    call_command(from_command_line, "--once", "--memory", "0", "-v", "0")
    # ... and lets its other threads have the GIL sooner (not with --threads: below)
    assert calls == ["collect", "freeze", loop.SWITCH_INTERVAL]
    assert QueuedJob.objects.count() == 0
    calls.clear()
    with_threads = Command()  # (on an empty queue: its threads could not see this
    with_threads._called_from_command_line = True  # test's uncommitted rows)
    call_command(with_threads, "--stop-when-empty", "--threads", "2", "--memory", "0",
                 "-v", "0")
    assert calls == ["collect", "freeze"]
