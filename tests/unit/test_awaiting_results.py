"""``handle.wait()`` / ``await handle.await_result()`` and the django.tasks backend's
``wait()`` in one process (docs/long-jobs.md#awaiting-a-result). With real worker processes
and PostgreSQL's NOTIFY: tests/integration/test_long_jobs_processes.py."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections

from django_jobguard.exceptions import JobFailedError
from django_jobguard.jobs import Dispatched
from django_jobguard.models import QueuedJob
from django_jobguard.testing import drain
from tests.support import requires_postgres
from tests.support.long_jobs import DebouncedRecord, FailsWithResult, Sleeper

pytestmark = pytest.mark.django_db(transaction=True)


def test_wait_returns_what_handle_returned():
    handle = Sleeper("a", value={"invoices": 3}).dispatch()
    drain()
    assert handle.wait(timeout=5) == {"invoices": 3}


def test_wait_wakes_when_a_worker_in_another_thread_finishes_the_job():
    handle = Sleeper("b", seconds=0.2, value=7).dispatch()
    seen = []
    def wait() -> None:
        try:
            seen.append(handle.wait(timeout=30))
        finally:
            connections.close_all()  # the thread's own connection, or the test database stays open

    waiter = threading.Thread(target=wait)
    waiter.start()
    drain()
    waiter.join(30)
    assert seen == [7]


def test_await_result_in_async_code():
    handle = Sleeper("c", value="done").dispatch()
    drain()
    assert asyncio.run(handle.await_result(timeout=5)) == "done"


def test_a_failed_job_raises_job_failed_error_naming_its_exception():
    handle = FailsWithResult().dispatch()
    drain()
    with pytest.raises(JobFailedError, match="no invoice 7") as info:
        handle.wait(timeout=5)
    assert info.value.exception_class == "builtins.ValueError"
    assert "Traceback" in info.value.traceback


def test_wait_gives_up_after_its_timeout_and_the_job_stays_queued():
    handle = Sleeper("nobody runs me").dispatch()
    with pytest.raises(TimeoutError, match="did not finish within 0.2 s"):
        handle.wait(timeout=0.2)
    assert QueuedJob.objects.filter(id=handle.id).exists()


def test_waiting_needs_a_job_that_keeps_results_and_was_queued():
    with pytest.raises(TypeError, match="does not keep results"):
        DebouncedRecord("k", "v").dispatch().wait(timeout=1)
    skipped = Dispatched(id=None, job_name=Sleeper.name, queue="default", skipped="unique")
    with pytest.raises(ValueError, match="skipped"):
        skipped.wait(timeout=1)
    gone = Dispatched(id=str(uuid.uuid4()), job_name=Sleeper.name, queue="default")
    with pytest.raises(LookupError, match="neither queued nor finished"):
        gone.wait(timeout=1)


def test_the_tasks_backend_waits_for_a_task_result():
    from tests.support import tasks

    if tasks.task is None:
        pytest.skip("needs django.tasks or the backport")
    from django_jobguard.tasks_backend import wait

    result = tasks.add.enqueue(2, 3)
    with pytest.raises(TimeoutError):
        wait(result, timeout=0.1)
    drain()
    assert wait(result, timeout=5) is result
    assert result.return_value == 5 and result.status == "SUCCESSFUL"


def _closed_listener_pid() -> int:
    """Open a result listener and close it (its connection is kept): its backend's pid."""
    from django_jobguard.dialects import dialect_for

    listener = dialect_for("default").listen_results()
    pid = listener._conn.info.backend_pid
    listener.close()
    return pid


def _sql(statement: str, *params: object) -> object:
    with connections["default"].cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()[0]


@contextmanager
def _listener() -> Iterator:
    """A result listener, closed with every kept connection when the block ends."""
    from django_jobguard.dialects import dialect_for
    from django_jobguard.dialects.postgresql import close_idle_result_connections

    listener = dialect_for("default").listen_results()
    try:
        yield listener
    finally:
        listener.close()
        close_idle_result_connections()


@requires_postgres
def test_a_closed_result_listener_keeps_its_connection_for_the_next_wait_without_listening():
    """A new connection per ``wait()`` was most of its latency on a loaded machine
    (docs/benchmarks.md): a closed listener's connection is kept, its LISTEN ended."""
    from django_jobguard.dialects.postgresql import RESULT_CHANNEL, close_idle_result_connections

    pid = _closed_listener_pid()
    assert _sql("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid) == 1  # kept ...
    _sql("SELECT pg_notify(%s, 'x')", RESULT_CHANNEL)
    with _listener() as second:
        assert second._conn.info.backend_pid == pid  # ... and taken again
        assert second.wait(0.05) == set()  # nothing heard while it was kept
        _sql("SELECT pg_notify(%s, 'y')", RESULT_CHANNEL)
        assert second.wait(5) == {"y"}  # listening again
    pid = _closed_listener_pid()
    close_idle_result_connections()
    with _listener() as third:
        assert third._conn.info.backend_pid != pid


@requires_postgres
def test_a_kept_connection_that_died_is_replaced():
    from django_jobguard.dialects.postgresql import RESULT_CHANNEL

    pid = _closed_listener_pid()
    _sql("SELECT pg_terminate_backend(%s)", pid)
    with _listener() as second:
        assert second._conn.info.backend_pid != pid
        _sql("SELECT pg_notify(%s, 'z')", RESULT_CHANNEL)
        assert second.wait(5) == {"z"}


@requires_postgres
def test_a_forked_child_neither_takes_nor_closes_the_connections_its_parent_kept():
    from django_jobguard.dialects.postgresql import _idle_result_connections as idle

    pid = _closed_listener_pid()
    parents = [conn for conns in idle._kept.values() for conn, _ in conns]
    idle._pid = -1  # what a forked child finds: they belong to another process
    try:
        with _listener() as child:
            assert child._conn.info.backend_pid != pid
        assert _sql("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid) == 1
    finally:
        for conn in parents:
            conn.close()
