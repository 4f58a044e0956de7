"""Operations commands: failed, retry, forget, flush, prune, clear, monitor."""

from __future__ import annotations

import datetime
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob, Worker
from tests.support import jobs

pytestmark = pytest.mark.django_db


def call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def failed(name: str = "tests.support.jobs.Noop", queue: str = "default", hours_ago: float = 0,
           payload: dict | None = None) -> FailedJob:
    row = FailedJob.objects.create(name=name, queue=queue, payload=payload or {"args": [1],
                                   "kwargs": {}}, exception_class="builtins.RuntimeError",
                                   message="boom", attempts=3)
    if hours_ago:
        FailedJob.objects.filter(id=row.id).update(
            failed_at=timezone.now() - datetime.timedelta(hours=hours_ago))
    return row


def test_failed_lists_rows_and_json():
    row = failed()
    assert str(row.id) in call("jobs_failed")
    data = json.loads(call("jobs_failed", "--json"))
    assert data[0]["id"] == str(row.id) and data[0]["exception"] == "builtins.RuntimeError"
    FailedJob.objects.all().delete()
    assert "No failed jobs." in call("jobs_failed")


def test_retry_one_requeues_with_fresh_attempts():
    row = failed()
    call("jobs_retry", str(row.id))
    job = QueuedJob.objects.get(id=row.id)
    assert job.attempts == 0 and job.payload["args"] == [1]
    assert not FailedJob.objects.exists()


def test_retry_all_by_queue():
    failed(queue="a")
    failed(queue="b")
    assert "1 job(s) queued again." in call("jobs_retry", "all", "--queue", "a")
    assert QueuedJob.objects.get().queue == "a"
    assert FailedJob.objects.get().queue == "b"


def test_retry_recomputes_an_expired_retry_until():
    class Deadline(jobs.Noop):
        name = "tests.cmd.Deadline"

        def retry_until(self):
            return timezone.now() + datetime.timedelta(minutes=10)

    row = failed(name="tests.cmd.Deadline",
                 payload={"args": [], "kwargs": {}, "retry_until": "2000-01-01T00:00:00+00:00"})
    call("jobs_retry", str(row.id))
    deadline = datetime.datetime.fromisoformat(QueuedJob.objects.get().payload["retry_until"])
    assert deadline > timezone.now() + datetime.timedelta(minutes=9)


def test_retry_unknown_id_is_an_error():
    with pytest.raises(CommandError, match="No failed job matches"):
        call("jobs_retry", "8a1f4f3c-0000-0000-0000-000000000000")
    with pytest.raises(CommandError, match="UUIDs"):
        call("jobs_retry", "not-a-uuid")


def test_forget():
    row = failed()
    call("jobs_forget", str(row.id))
    assert not FailedJob.objects.exists()
    with pytest.raises(CommandError, match="No failed job matches"):
        call("jobs_forget", str(row.id))


def test_flush_and_prune():
    failed(hours_ago=48)
    failed(hours_ago=1)
    assert "1 entries deleted." in call("jobs_prune_failed", "--hours", "24")
    assert FailedJob.objects.count() == 1
    assert "1 failed job(s) deleted." in call("jobs_flush")
    assert not FailedJob.objects.exists()


def test_clear_deletes_waiting_jobs_of_a_queue():
    jobs.Noop().dispatch(queue="a")
    jobs.Noop().dispatch(queue="b")
    assert "Cleared 1 job(s) from the [a] queue(s)." in call("jobs_clear", "--queue", "a")
    assert list(QueuedJob.objects.values_list("queue", flat=True)) == ["b"]


def test_monitor_exits_1_over_threshold():
    Worker.objects.create(id="elsewhere:1:w", hostname="elsewhere", pid=1, queues="*")
    for _ in range(3):
        jobs.Noop().dispatch()
    jobs.Noop().dispatch(queue="high")
    out = call("jobs_monitor", "default:10,high:5")
    assert "default" in out and "OK" in out
    with pytest.raises(SystemExit) as exc:
        call("jobs_monitor", "default:3,high:5")
    assert exc.value.code == 1
    data = json.loads(call("jobs_monitor", "default:10", "--json"))
    assert data == [{"queue": "default", "size": 3, "waiting": 3, "delayed": 0, "reserved": 0,
                     "failed": 0, "max": 10, "status": "OK", "unserved": False,
                     "paused": False, "latency_seconds": data[0]["latency_seconds"],
                     "recommended_workers": 1, "breached": []}]
    assert data[0]["latency_seconds"] >= 0
    with pytest.raises(CommandError, match="must be a number"):
        call("jobs_monitor", "default:lots")


def test_jobworker_rejects_bad_options():
    with pytest.raises(CommandError, match="--backoff takes seconds"):
        call("jobworker", "--backoff", "soon", "--once")
    with pytest.raises(CommandError, match="--concurrency must be at least 1"):
        call("jobworker", "--concurrency", "0")
    with pytest.raises(CommandError, match="--reload runs one worker process"):
        call("jobworker", "--reload", "--concurrency", "2")
    with pytest.raises(CommandError, match="--reload-grace must not be negative"):
        call("jobworker", "--reload", "--reload-grace", "-1")
    with pytest.raises(CommandError, match="--threads must be at least 1"):
        call("jobworker", "--threads", "0")
    with pytest.raises(CommandError, match="--reload runs one job at a time"):
        call("jobworker", "--reload", "--threads", "4")
    with pytest.raises(CommandError, match="--queue: 'high:x': the number after ':' must be"):
        call("jobworker", "--queue", "high:x,default:1")
    with pytest.raises(CommandError, match="give every queue a number or none"):
        call("jobworker", "--queue", "high:3,default")


@pytest.mark.django_db(transaction=True)  # the threads use their own connections
def test_jobworker_with_threads_and_weighted_queues_runs_the_jobs():
    dispatch_many([jobs.Noop(n) for n in range(4)])
    dispatch_many([jobs.Noop(n) for n in range(2)], queue="high")
    out = call("jobworker", "--threads", "3", "--queue", "high:1,default:2",
               "--stop-when-empty", "--sleep", "0", "--memory", "0")
    assert out.count(" DONE ") == 6 and not QueuedJob.objects.exists()


def test_jobworker_once_runs_one_job():
    jobs.Noop(1).dispatch()
    jobs.Noop(2).dispatch()
    # --memory 0: the limit is about worker processes; this one is pytest with every test
    # module (schemathesis, hypothesis, ...) loaded, well past the 128 MB default.
    out = call("jobworker", "--once", "--memory", "0")
    assert out.count(" DONE ") == 1
    assert QueuedJob.objects.count() == 1


def test_jobworker_refuses_a_negative_stop_timeout():
    with pytest.raises(CommandError, match="--stop-timeout must not be negative"):
        call("jobworker", "--stop-timeout", "-1")


def test_jobworker_says_what_it_serves_as_it_starts():
    """Issue 30 item 3: one start-up line (version, pid, queues, database, store, mode)."""
    import os

    import django_jobguard

    out = call("jobworker", "--queue", "default,high", "--threads", "2", "--stop-when-empty",
               "--memory", "0")
    (line,) = [line for line in out.splitlines() if " worker, pid " in line]
    assert f"jobguard {django_jobguard.__version__} worker, pid {os.getpid()}: queues " \
           "default, high; database 'default' (" in line, line
    assert "store 'database'; 1 process, 2 threads for sync jobs, up to 10 async jobs" in line


def test_jobworker_warns_about_a_queue_never_seen_and_suggests_a_known_one():
    jobs.Noop(1).dispatch(queue="billing")
    out = call("jobworker", "--queue", "biling,default", "--stop-when-empty", "--memory", "0")
    warnings = [line for line in out.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, out  # "default" is known: no warning for it
    assert ("Queue 'biling' has never been seen: no job, worker or registered job uses it. "
            "Did you mean 'billing'?") in warnings[0]
    out = call("jobworker", "--queue", "billing", "--stop-when-empty", "--memory", "0")
    assert " WARNING " not in out and out.count(" DONE ") == 1


def test_jobworker_at_verbosity_zero_says_nothing():
    assert call("jobworker", "--queue", "biling", "--stop-when-empty", "--memory", "0",
                "-v", "0") == ""


@pytest.mark.django_db(databases=["default", "queue"])  # Django 6.1's checks visit every alias
def test_read_only_commands_show_a_settings_error_instead_of_stopping():
    """Issue 30 item 5: a store mistake must not hide the failed jobs from whoever fixes it."""
    from django.core.management.base import SystemCheckError
    from django.test import override_settings

    failed()
    with override_settings(JOBGUARD={"STORE": "memcached"}):
        err = StringIO()
        out = StringIO()
        call_command("jobs_failed", skip_checks=False, stdout=out, stderr=err)
        assert "RuntimeError: boom" in out.getvalue()
        assert "jobguard.E004" in err.getvalue()
        call_command("jobs_monitor", skip_checks=False, stdout=StringIO(), stderr=StringIO())
        with pytest.raises(SystemCheckError):  # a command that changes things still stops
            call_command("jobs_retry", "all", skip_checks=False, stdout=StringIO())
