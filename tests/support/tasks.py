"""django.tasks tasks used by tests/test_tasks_backend.py, defined with the public ``@task``.

Worker subprocesses import this module through ``JOBGUARD["JOB_MODULES"]`` (tests.settings).
Without django.tasks or the backport nothing is defined and those tests skip.
"""

from __future__ import annotations

import inspect
import os
import time

from demo.models import JobRun
from django.utils import timezone

from django_jobguard import JobMiddleware
from tests.support.waiting import wait_for_gate

try:
    from django.tasks import task
except ImportError:
    try:
        from django_tasks import task
    except ImportError:
        task = None

if task is not None and not any(p.kind is p.VAR_KEYWORD
                                for p in inspect.signature(task).parameters.values()):
    # Django 6.0's @task takes no backend options; jobguard's @task is the documented stand-in.
    from django_jobguard.tasks_backend import task as guarded_task
else:
    guarded_task = task


def _record(label: str, key: str = "", seconds: float = 0.0, attempt: int = 0,
            gate: str = "") -> JobRun:
    run = JobRun.objects.create(label=label, key=key, pid=os.getpid(), attempt=attempt,
                                started_at=timezone.now())
    if gate:
        wait_for_gate(gate)
    if seconds:
        time.sleep(seconds)
    run.ended_at = timezone.now()
    run.save(update_fields=["ended_at"])
    return run


class Tag(JobMiddleware):
    """Records that it ran around the task (proves middleware runs in the worker)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def handle(self, job, next):
        _record(f"middleware:{self.label}", key=str(job.kwargs.get("key", "")))
        return next(job)


class DropAll(JobMiddleware):
    """Drops the task without running it."""

    def handle(self, job, next):
        return None


if task is not None:

    @task
    def add(a: int, b: int) -> int:
        return a + b

    @task(queue_name="tasks", priority=5)
    def record(label: str, key: str = "", seconds: float = 0.0, gate: str = "") -> str:
        return str(_record(label, key, seconds, gate=gate).pk)

    @task(takes_context=True)
    def with_context(context, label: str) -> dict:
        _record(label, attempt=context.attempt)
        return {"attempt": context.attempt, "result_id": context.task_result.id,
                "status": str(context.task_result.status)}

    @task
    async def async_double(n: int) -> int:
        return n * 2

    @task
    def returns_a_set() -> set:
        return {1, 2}

    @guarded_task(tries=3, backoff=0)
    def flaky(label: str, failures: int) -> int:
        done = JobRun.objects.filter(label=label).count()
        _record(label, attempt=done + 1)
        if done < failures:
            raise ValueError(f"flaky failure {done + 1}")
        return done + 1

    @guarded_task(tries=2, backoff=0)
    def always_fails(label: str) -> None:
        _record(label)
        raise RuntimeError(f"{label} is broken")

    @guarded_task(unique_for=60, unique_key="product_id")
    def reindex(product_id: int, seconds: float = 0.0) -> int:
        _record("reindex", key=str(product_id), seconds=seconds)
        return product_id

    @guarded_task(unique_key=lambda user_id, **kw: f"user-{user_id}",
                  unique_until_processing=True)
    def sync_user(user_id: int, seconds: float = 0.0) -> int:
        _record("sync_user", key=str(user_id), seconds=seconds)
        return user_id

    @guarded_task(middleware=[Tag("static"), lambda job: Tag(f"key-{job.kwargs['key']}")])
    def tagged(key: str) -> str:
        _record("tagged", key=key)
        return key

    @guarded_task(middleware=[DropAll()])
    def dropped() -> str:
        _record("dropped")
        return "ran"
