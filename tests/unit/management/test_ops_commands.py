"""jobs_retry's filters, jobs_requeue, and the confirmation of jobs_clear / jobs_flush /
jobs_locks --release (a prompt at a terminal, --noinput for scripts)."""

from __future__ import annotations

import io
import sys

import pytest
from django.core.management import CommandError, call_command

from django_jobguard import get_store
from django_jobguard.models import FailedJob, QueuedJob, Worker
from tests.support.operate import reserved, waiting

pytestmark = pytest.mark.django_db


def call(*args, **kwargs) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **kwargs)
    return out.getvalue()


def failed(invoice_id, exception="builtins.RuntimeError", queue_name="default"):
    return FailedJob.objects.create(name="tests.support.jobs.Boom", queue=queue_name,
                                    payload={"args": [], "kwargs": {"invoice_id": invoice_id}},
                                    exception_class=exception, message="boom")


def test_jobs_retry_by_argument_exception_and_name():
    a = failed(7, exception="builtins.TimeoutError")
    failed(7)
    failed(8, exception="builtins.TimeoutError")
    out = call("jobs_retry", "--arg", "kwargs__invoice_id=7", "--exception", "TimeoutError")
    assert "1 job(s) queued again." in out
    assert list(QueuedJob.objects.values_list("id", flat=True)) == [a.id]
    assert "2 job(s) queued again." in call("jobs_retry", "--name", "tests.support.jobs.Boom")
    assert not FailedJob.objects.exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--arg", "kwargs__invoice_id=seven"], "is not valid JSON"),
    (["--arg", "invoice_id=7"], "is not an argument lookup"),
    (["--arg", "kwargs__invoice_id"], "write LOOKUP=JSON"),
    (["--queue", "emials"], "Unknown queue 'emials'"),
    (["--arg", "kwargs__invoice_id=7", "--arg", "kwargs__invoice_id=8"],
     "kwargs__invoice_id is given twice"),
    ([], "Give failed job ids, 'all', or a filter"),
    (["00000000-0000-0000-0000-000000000001", "--name", "x"], "not both"),
])
def test_jobs_retry_bad_filters_are_clear_errors(args, says):
    failed(7)
    with pytest.raises(CommandError, match=says):
        call("jobs_retry", *args)
    assert FailedJob.objects.count() == 1


def test_jobs_retry_all_and_ids_still_work():
    a, b = failed(1), failed(2, queue_name="other")
    assert "1 job(s) queued again." in call("jobs_retry", str(a.id))
    assert "1 job(s) queued again." in call("jobs_retry", "all", "--queue", "other")
    assert set(QueuedJob.objects.values_list("id", flat=True)) == {a.id, b.id}


def test_jobs_requeue_puts_back_orphans_and_refuses_live_workers_jobs():
    stale = reserved(worker_id="otherhost:3:dead", queue_name="a")
    Worker.objects.filter(id="otherhost:3:dead").update(last_seen_at="2000-01-01T00:00:00Z")
    live = reserved(worker_id="otherhost:3:live", queue_name="b")
    with pytest.raises(CommandError, match="held by a live worker"):
        call("jobs_requeue", str(live.id))
    assert "1 job(s) requeued." in call("jobs_requeue", "--stale")
    assert QueuedJob.objects.with_state().get(id=stale.id).state == "waiting"
    assert QueuedJob.objects.with_state().get(id=live.id).state == "reserved"
    with pytest.raises(CommandError, match="ids or --stale"):
        call("jobs_requeue")


@pytest.fixture
def terminal(monkeypatch):
    """stdin is a terminal; answers come from the list (an unexpected prompt fails)."""
    answers: list[str] = []
    prompts: list[str] = []
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)

    def fake_input(prompt=""):
        prompts.append(prompt)
        return answers.pop(0)

    monkeypatch.setattr("builtins.input", fake_input)
    return answers, prompts


def test_jobs_clear_asks_at_a_terminal(terminal):
    answers, prompts = terminal
    waiting(queue_name="a")
    waiting(queue_name="a")
    answers.append("no")
    with pytest.raises(CommandError, match="Cancelled; nothing was deleted."):
        call("jobs_clear", "--queue", "a")
    assert "This deletes 2 waiting or delayed job(s) from the [a] queue(s)." in prompts[0]
    assert QueuedJob.objects.count() == 2
    answers.append("yes")
    assert "Cleared 2 job(s)" in call("jobs_clear", "--queue", "a")
    waiting(queue_name="a")
    assert "Cleared 1 job(s)" in call("jobs_clear", "--noinput")  # no prompt
    assert len(prompts) == 2


def test_jobs_flush_asks_at_a_terminal_and_not_in_scripts(terminal, monkeypatch):
    answers, prompts = terminal
    failed(1)
    answers.append("n")
    with pytest.raises(CommandError, match="Cancelled"):
        call("jobs_flush")
    assert "This deletes 1 failed job(s) for good." in prompts[0]
    assert FailedJob.objects.exists()
    assert "1 failed job(s) deleted." in call("jobs_flush", "--yes")
    failed(2)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    assert "1 failed job(s) deleted." in call("jobs_flush")  # no terminal: as before
    assert len(prompts) == 1


def test_jobs_locks_release_asks_for_a_lock_of_a_live_job(terminal):
    answers, prompts = terminal
    store = get_store()
    job = waiting()
    store.acquire("jobguard:unique:x:1", str(job.id), job_id=str(job.id))
    store.acquire("jobguard:overlap:y", "someone")
    answers.append("no")
    with pytest.raises(CommandError, match="Cancelled"):
        call("jobs_locks", "--release", "jobguard:unique:x:1")
    assert store.get_lock("jobguard:unique:x:1") is not None
    assert "Released jobguard:overlap:y." in call("jobs_locks", "--release",
                                                  "jobguard:overlap:y")  # no job: no prompt
    assert "Released jobguard:unique:x:1." in call("jobs_locks", "--release",
                                                   "jobguard:unique:x:1", "--noinput")
    assert len(prompts) == 1
