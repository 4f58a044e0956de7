"""``jobs_locks`` (list, stale flags, --release, --clean, --store) and ``jobs_clear`` releasing
the unique locks of the jobs it deletes; both stores."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.operations import inspect_locks
from django_jobguard.stores import get_store
from django_jobguard.unique_jobs import lock_key
from tests.support import expire
from tests.support.lock_jobs import UniqueRecord

pytestmark = pytest.mark.django_db


def call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def store(store_alias):
    return get_store(store_alias)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def reserve(job_id: str, *, worker: str, pid: int, minutes_ago: float = 0) -> None:
    """Mark a queued job as running on ``worker`` (a row with ``pid`` on this host)."""
    now = timezone.now() - datetime.timedelta(minutes=minutes_ago)
    QueuedJob.objects.filter(id=job_id).update(
        reserved_at=now, reserved_by=worker, attempts=1,
        available_at=timezone.now() + datetime.timedelta(seconds=90))
    WorkerRow.objects.create(id=worker, hostname=socket.gethostname(), pid=pid, queues="default")


def test_lists_locks_with_kind_owner_token_expiry_and_stale_flags(store):
    queued = UniqueRecord("a").dispatch()
    running = UniqueRecord("b").dispatch()
    reserve(running.id, worker="alive:1", pid=os.getpid())
    crashed = UniqueRecord("c").dispatch()
    reserve(crashed.id, worker="dead:1", pid=dead_pid())
    store.acquire("jobguard:overlap:tests.X:running", f"{running.id}:r1", ttl=120,
                  job_id=running.id)
    store.acquire("jobguard:overlap:tests.X:crashed", f"{crashed.id}:r1", job_id=crashed.id)
    store.acquire("jobguard:overlap:tests.X:queued", f"{queued.id}:r1", job_id=queued.id)
    store.acquire("jobguard:unique:tests.Gone:1", "gone", job_id=str(QueuedJob().id))

    statuses = {s.key: s for s in inspect_locks(store)}
    assert not statuses[lock_key(UniqueRecord("a"))].stale
    assert not statuses[lock_key(UniqueRecord("b"))].stale
    # The dead process on this host shows at once, before its heartbeat is RETRY_AFTER old.
    assert statuses[lock_key(UniqueRecord("c"))].stale_reason == "worker dead:1 is gone"
    assert not statuses["jobguard:overlap:tests.X:running"].stale
    assert statuses["jobguard:overlap:tests.X:crashed"].stale_reason == "worker dead:1 is gone"
    assert "is not running" in statuses["jobguard:overlap:tests.X:queued"].stale_reason
    assert "no longer queued" in statuses["jobguard:unique:tests.Gone:1"].stale_reason

    out = call("jobs_locks", "--store", store.alias)
    line = next(x for x in out.splitlines() if "tests.X:running" in x)
    assert "overlap" in line and f"{running.id}:r1" in line and "in 1" in line
    line = next(x for x in out.splitlines() if "UniqueRecord:a" in x)
    assert "unique" in line and queued.id in line and "never" in line and "STALE" not in line
    assert "STALE: worker dead:1 is gone" in out
    assert "7 lock(s)" in out and "4 stale" in out and "--release KEY" in out

    data = json.loads(call("jobs_locks", "--json", "--stale"))
    assert sorted(d["key"] for d in data) == ["jobguard:overlap:tests.X:crashed",
                                              "jobguard:overlap:tests.X:queued",
                                              "jobguard:unique:tests.Gone:1",
                                              lock_key(UniqueRecord("c"))]
    assert json.loads(call("jobs_locks", "--json", "--prefix", "jobguard:unique:tests.Gone"))[
        0]["reason"] == "its job is no longer queued"
    assert all(d["stale"] and d["reason"] and isinstance(d["token"], int) for d in data)


def test_an_overlap_lock_from_an_earlier_attempt_is_stale(store):
    handle = UniqueRecord("a").dispatch()
    store.acquire("jobguard:overlap:tests.X:k", f"{handle.id}:old", job_id=handle.id)
    reserve(handle.id, worker="alive:2", pid=os.getpid())
    QueuedJob.objects.filter(id=handle.id).update(
        reserved_at=timezone.now() + datetime.timedelta(minutes=5))  # taken again later
    (status,) = [s for s in inspect_locks(store) if s.info.kind == "overlap"]
    assert status.stale and "taken again" in status.stale_reason


def test_release_and_clean(store):
    store.acquire("jobguard:overlap:tests.X:a", "a")
    store.acquire("jobguard:overlap:tests.X:b", "b", ttl=60)
    assert "Released jobguard:overlap:tests.X:a." in call("jobs_locks", "--release",
                                                         "jobguard:overlap:tests.X:a")
    assert store.get_lock("jobguard:overlap:tests.X:a") is None
    with pytest.raises(CommandError, match="Not held: jobguard:overlap:tests.X:a"):
        call("jobs_locks", "--release", "jobguard:overlap:tests.X:a")
    expire(store, "jobguard:overlap:tests.X:b")
    if store.alias == "database":
        assert "expired" in call("jobs_locks") and "STALE: expired" in call("jobs_locks")
    assert "expired lock(s)" in call("jobs_locks", "--clean")
    assert "No locks in store" in call("jobs_locks")


def test_unknown_store_is_a_command_error():
    with pytest.raises(CommandError, match="no store named 'nope'"):
        call("jobs_locks", "--store", "nope")


@pytest.mark.parametrize("kind, args", [
    ("database", []), ("redis", []),
    ("database", ["--release", "jobguard:overlap:tests.X:a"]),
    ("redis", ["--release", "jobguard:overlap:tests.X:a"]),
    ("database", ["--clean"]), ("redis", ["--clean"])])
def test_a_store_that_cannot_be_reached_is_a_command_error_naming_it(kind, args):
    """One line on stderr and exit status 1 (``CommandError``); before, a traceback. Redis
    drops expired keys itself, but ``--clean`` still asks it (before, it asked nothing and
    said "Removed 0 expired lock(s)." with the store down, exit status 0)."""
    from tests.support.store_faults import CUT, store_down

    with store_down(kind) as alias, pytest.raises(CommandError) as caught:
        call("jobs_locks", "--store", alias, *args)
    error = CUT if kind == "database" else str(caught.value.__cause__.error)
    assert str(caught.value) == f"Store {alias!r} cannot be reached: {error}"
    assert "\n" not in str(caught.value) and caught.value.returncode == 1


def test_clear_releases_the_unique_locks_of_the_jobs_it_deletes(store):
    waiting = UniqueRecord("waiting").dispatch()
    running = UniqueRecord("running").dispatch()
    crashed = UniqueRecord("crashed").dispatch()
    other_queue = UniqueRecord("other").dispatch(queue="other")
    reserve(running.id, worker="alive:3", pid=os.getpid())
    QueuedJob.objects.filter(id=crashed.id).update(
        reserved_at=timezone.now(), reserved_by="dead:2",
        available_at=timezone.now() - datetime.timedelta(seconds=1))  # its lease ran out
    out = call("jobs_clear", "--queue", "default")
    assert "Cleared 2 job(s)" in out and "Released 2 unique lock(s)." in out
    left = {str(i) for i in QueuedJob.objects.values_list("id", flat=True)}
    assert left == {running.id, other_queue.id}
    assert UniqueRecord("waiting").dispatch() and UniqueRecord("crashed").dispatch()
    assert not UniqueRecord("running").dispatch()  # still running: keeps its lock
    assert not UniqueRecord("other").dispatch()
    assert waiting


def test_clear_keep_locks_leaves_locks_that_no_longer_block(store):
    UniqueRecord("a").dispatch()
    assert "Cleared 1 job(s)" in call("jobs_clear", "--keep-locks")
    (status,) = inspect_locks(store)  # the lock outlived its job (as in laravel #36927)...
    assert status.stale and "no longer queued" in status.stale_reason
    assert UniqueRecord("a").dispatch()  # ...but its job has no row: the next one takes it
