"""The django.tasks backend, driven only through the public django.tasks API.

Tasks are enqueued with ``Task.enqueue``/``aenqueue`` and inspected with ``get_result``,
``refresh`` and the task signals; jobguard workers (in-process, or real ``jobworker``
processes) run them.
"""

from __future__ import annotations

import datetime
import io
import uuid

import pytest
from asgiref.sync import async_to_sync
from demo.models import JobRun
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_jobguard.models import FailedJob, JobResult, QueuedJob
from django_jobguard.worker import Worker, WorkerOptions
from tests.support import tasks, wait_for

if tasks.task is None:
    pytest.skip("needs django.tasks (Django >= 6.0) or the django-tasks backport",
                allow_module_level=True)

try:
    from django.tasks import TaskResultStatus, task, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    from django_tasks import TaskResultStatus, task, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

pytestmark = pytest.mark.django_db

QUEUES = ["default", "tasks"]


def work(**options) -> list[str]:
    """Run an in-process jobguard worker on the task queues until they are empty."""
    states: list[str] = []
    # memory=0: the 128 MB limit is for worker processes, not for pytest running every module.
    options = {"stop_when_empty": True, "sleep": 0, "memory": 0, **options}
    worker = Worker(WorkerOptions(queues=QUEUES, **options),
                    log=lambda line, state: states.append(state))
    assert worker.run() == 0
    return [s for s in states if s != "RUNNING"]


def test_backend_declares_what_it_supports():
    backend = task_backends["default"]
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority
    assert list(backend.check()) == []


def test_enqueue_is_ready_then_a_worker_makes_it_successful():
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3] and result.kwargs == {} and result.backend == "default"
    assert result.enqueued_at is not None and result.started_at is None
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY and fetched.args == [2, 3]
    with pytest.raises(ValueError, match="not finished"):
        _ = fetched.return_value

    assert work() == ["DONE"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished and result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_retries_keep_every_error_and_worker_until_success():
    result = tasks.flaky.enqueue("flaky", failures=2)
    assert work(once=True) == ["RELEASED"]
    result.refresh()
    assert result.status == TaskResultStatus.READY  # waiting for its retry
    assert len(result.errors) == 1 and result.attempts == 1
    assert work() == ["RELEASED", "DONE"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    assert result.attempts == 3 and len(result.errors) == 2
    assert all(e.exception_class is ValueError for e in result.errors)
    assert "flaky failure 2" in result.errors[1].traceback
    assert result.started_at < result.last_attempted_at  # first start kept


def test_a_task_that_keeps_failing_ends_failed_with_its_errors():
    result = tasks.always_fails.enqueue("broken")
    assert work() == ["RELEASED", "FAILED"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert "broken is broken" in result.errors[-1].traceback
    assert result.attempts == 2
    assert FailedJob.objects.filter(id=result.id).exists()


def test_jobs_retry_puts_a_failed_task_back_to_ready_and_it_can_succeed():
    result = tasks.always_fails.enqueue("again")
    work()
    call_command("jobs_retry", "all", stdout=io.StringIO())
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.finished_at is None
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 4


def test_takes_context_gets_the_running_result():
    result = tasks.with_context.enqueue("ctx")
    work()
    result.refresh()
    assert result.return_value == {"attempt": 1, "result_id": result.id, "status": "RUNNING"}


def test_async_task_functions_run():
    result = tasks.async_double.enqueue(21)
    work()
    result.refresh()
    assert result.return_value == 42


def test_a_return_value_that_is_not_json_fails_without_retrying():
    result = tasks.returns_a_set.enqueue()
    assert work() == ["FAILED"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError
    assert "cannot be stored as JSON" in result.errors[0].traceback


def test_arguments_that_are_not_json_are_rejected_and_nothing_is_queued():
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert not QueuedJob.objects.exists() and not JobResult.objects.exists()


def test_run_after_delays_the_task():
    later = timezone.now() + datetime.timedelta(hours=1)
    delayed = tasks.add.using(run_after=later).enqueue(1, 1)
    now = tasks.add.enqueue(2, 2)
    assert work() == ["DONE"]
    now.refresh()
    delayed.refresh()
    assert now.status == TaskResultStatus.SUCCESSFUL
    assert delayed.status == TaskResultStatus.READY
    assert tasks.add.get_result(delayed.id).task.run_after == later


def test_priority_orders_the_queue():
    for label, priority in [("low", -50), ("mid", 0), ("high", 50)]:
        tasks.record.using(priority=priority).enqueue(label)
    work()
    assert list(JobRun.objects.order_by("id").values_list("label", flat=True)) == [
        "high", "mid", "low"]
    result = tasks.record.using(priority=7).enqueue("x")
    assert tasks.record.get_result(result.id).task.priority == 7


def test_get_result_of_unknown_or_foreign_ids():
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(str(uuid.uuid4()))
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("not-a-uuid")
    other = tasks.record.enqueue("other")
    with pytest.raises(TaskResultMismatch):
        tasks.add.get_result(other.id)


def test_aenqueue_and_aget_result():
    result = async_to_sync(tasks.add.aenqueue)(20, 22)
    work()
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert fetched.return_value == 42
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_signals_follow_the_task():
    seen: list[tuple[str, str, str]] = []

    def receiver(name):
        def on(sender, task_result, **kwargs):
            seen.append((name, task_result.task.name, str(task_result.status)))
        return on

    receivers = [(task_enqueued, receiver("enqueued")), (task_started, receiver("started")),
                 (task_finished, receiver("finished"))]
    for signal, fn in receivers:
        signal.connect(fn)
    try:
        tasks.add.enqueue(1, 2)
        tasks.returns_a_set.enqueue()
        work()
    finally:
        for signal, fn in receivers:
            signal.disconnect(fn)
    assert seen == [
        ("enqueued", "add", "READY"), ("enqueued", "returns_a_set", "READY"),
        ("started", "add", "RUNNING"), ("finished", "add", "SUCCESSFUL"),
        ("started", "returns_a_set", "RUNNING"), ("finished", "returns_a_set", "FAILED"),
    ]


def test_middleware_runs_around_the_task_in_the_worker():
    result = tasks.tagged.enqueue(key="k1")
    work()
    labels = list(JobRun.objects.order_by("id").values_list("label", "key"))
    assert labels == [("middleware:static", "k1"), ("middleware:key-k1", "k1"), ("tagged", "k1")]
    result.refresh()
    assert result.return_value == "k1"


def test_a_task_dropped_by_middleware_finishes_without_an_attempt():
    result = tasks.dropped.enqueue()
    assert work() == ["SKIPPED"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value is None
    assert result.attempts == 0
    assert not JobRun.objects.exists()


def test_unique_task_enqueued_five_times_runs_once_and_returns_the_same_result(store_alias):
    results = [tasks.reindex.enqueue(product_id=7) for _ in range(5)]
    other = tasks.reindex.enqueue(8)  # positional argument, other key
    assert len({r.id for r in results}) == 1 and other.id != results[0].id
    work()
    assert sorted(JobRun.objects.values_list("key", flat=True)) == ["7", "8"]
    results[0].refresh()
    assert results[0].return_value == 7
    again = tasks.reindex.enqueue(product_id=7)  # finished: the lock is free again
    assert again.id != results[0].id


@pytest.mark.parametrize("make", [
    lambda: task(queue_name="nope")(tasks._record),
    lambda: task(priority=101)(tasks._record),
    lambda: tasks.add.using(run_after=datetime.datetime(2030, 1, 1)),
    lambda: task(takes_context=True)(tasks._record),
    lambda: tasks.guarded_task(unique_key="missing")(tasks._record),
    lambda: tasks.guarded_task(tries=-1)(tasks._record),
    lambda: tasks.guarded_task(backoff=["x"])(tasks._record),
    lambda: tasks.guarded_task(middleware=[tasks.Tag])(tasks._record),
    lambda: tasks.guarded_task(unique_via="nowhere")(tasks._record),
], ids=["queue", "priority", "naive-run-after", "context-arg", "unique-key", "tries",
        "backoff", "middleware-class", "unique-via"])
def test_invalid_tasks_are_refused_with_a_reason(make):
    with pytest.raises(InvalidTask):
        make()


def test_a_function_outside_installed_apps_is_refused_at_enqueue():
    from django_jobguard.tasks_backend import JobGuardTask

    def local(): ...

    local.__module__, local.__qualname__ = "os", "getcwd"  # pretend to live elsewhere
    made = JobGuardTask(func=local, priority=0, backend="default", queue_name="default",
                        run_after=None)
    with pytest.raises(InvalidTask, match="not a django.tasks Task|refusing"):
        made.enqueue()


def test_backend_check_reports_bad_options():
    config = {"default": {"BACKEND": "django_jobguard.tasks_backend.JobGuardBackend",
                          "QUEUES": QUEUES, "OPTIONS": {"DATABSE": "x"}}}
    with override_settings(TASKS=config):
        ids = [m.id for m in task_backends["default"].check()]
    assert ids == ["jobguard.E010"]


def test_prune_results_keeps_recent_and_unfinished_ones():
    old = tasks.add.enqueue(1, 1)
    recent = tasks.add.enqueue(2, 2)
    work()
    waiting = tasks.add.enqueue(3, 3)
    JobResult.objects.filter(id=old.id).update(
        finished_at=timezone.now() - datetime.timedelta(days=10))
    call_command("jobs_prune_results", stdout=io.StringIO())  # 7 days by default
    with pytest.raises(TaskResultDoesNotExist):
        old.refresh()
    recent.refresh()
    waiting.refresh()
    assert waiting.status == TaskResultStatus.READY
    call_command("jobs_clear", stdout=io.StringIO())  # its job is gone
    JobResult.objects.filter(id=waiting.id).update(
        enqueued_at=timezone.now() - datetime.timedelta(days=10))
    call_command("jobs_prune_results", "--days", "1", stdout=io.StringIO())
    with pytest.raises(TaskResultDoesNotExist):
        waiting.refresh()
    recent.refresh()


# -- real worker processes ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_real_workers_run_many_tasks_and_results_show_running(workers, tmp_path):
    # The slow task waits at a gate opened once its result was read: it is still running
    # then however slow the test process is (1.5 s of sleep was a hope).
    gate = tmp_path / "gate"
    slow = tasks.record.enqueue("slow", seconds=0.2, gate=str(gate))
    results = [tasks.add.enqueue(i, i) for i in range(30)]
    pool = workers(2, "--queue", "tasks,default", "--stop-when-empty", "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(label="slow").exists())
    slow.refresh()
    assert slow.status == TaskResultStatus.RUNNING and slow.started_at is not None
    gate.touch()
    pool.wait(120)
    slow.refresh()
    assert slow.status == TaskResultStatus.SUCCESSFUL and slow.finished_at > slow.started_at
    for i, result in enumerate(results):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2 * i
        assert result.attempts == 1
    assert not QueuedJob.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_real_workers_unique_task_runs_once_and_until_processing_allows_a_second(
        workers, store_alias):
    for _ in range(5):
        tasks.reindex.enqueue(product_id=1)
    first = tasks.sync_user.enqueue(5, seconds=1.5)
    assert tasks.sync_user.enqueue(5).id == first.id  # queued: still unique
    pool = workers(2, "--stop-when-empty", "--sleep", "0.1")
    wait_for(lambda: JobRun.objects.filter(label="sync_user").exists())
    second = tasks.sync_user.enqueue(5)  # the first one is running: its lock is gone
    assert second.id != first.id
    pool.wait(120)
    workers(1, "--stop-when-empty", "--sleep", "0.1").wait(60)  # in case the pool missed it
    assert JobRun.objects.filter(label="reindex").count() == 1
    assert JobRun.objects.filter(label="sync_user").count() == 2
    second.refresh()
    assert second.status == TaskResultStatus.SUCCESSFUL


def test_log_lines_admin_and_api_name_a_task_by_its_own_dotted_name(admin_user):
    from rest_framework.test import APIClient

    from django_jobguard import registry

    result = tasks.add.enqueue(2, 3)
    row = QueuedJob.objects.get(id=result.id)
    assert row.name == "django_jobguard.task"  # the adapter's registered name
    assert registry.display_name(row.name, row.payload) == "tests.support.tasks.add"
    api = APIClient()
    api.force_authenticate(admin_user)
    assert api.get(f"/jobguard/api/jobs/{result.id}/").json()["display_name"] == \
        "tests.support.tasks.add"
    lines: list[str] = []
    worker = Worker(WorkerOptions(queues=QUEUES, stop_when_empty=True, sleep=0, memory=0),
                    log=lambda line, state: lines.append(line))
    assert worker.run() == 0
    assert any(f"tests.support.tasks.add [{result.id}]" in line and "DONE" in line
               for line in lines), lines
    assert not any("django_jobguard.task [" in line for line in lines)
    stored = JobResult.objects.get(id=result.id)
    assert registry.display_name(stored.name, stored.payload, result=True) == \
        "tests.support.tasks.add"
    assert str(stored) == f"tests.support.tasks.add [{result.id}]: SUCCESSFUL"


def test_rows_of_a_task_name_it_by_its_own_dotted_name_in_str():
    result = tasks.add.enqueue(2, 3)
    assert str(QueuedJob.objects.get(id=result.id)) == f"tests.support.tasks.add [{result.id}]"
    assert str(JobResult.objects.get(id=result.id)) == \
        f"tests.support.tasks.add [{result.id}]: READY"
    row = QueuedJob.objects.get(id=result.id)
    FailedJob.objects.create(id=row.id, name=row.name, queue=row.queue, payload=row.payload,
                             exception_class="builtins.ValueError")
    assert str(FailedJob.objects.get(id=result.id)) == \
        f"tests.support.tasks.add [{result.id}]: builtins.ValueError"
