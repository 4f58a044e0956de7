"""A ``django.tasks`` backend: ``@task`` functions run on jobguard's queue and workers.

``TASKS = {"default": {"BACKEND": "django_jobguard.tasks_backend.JobGuardBackend"}}`` and
``manage.py jobworker --queue default`` run them. Works with Django 6.0+'s ``django.tasks``
and with the ``django_tasks`` backport on Django 5.2 (whichever is installed; Django's own
wins). Each enqueue inserts a :class:`~django_jobguard.models.QueuedJob` for the adapter job
:class:`TaskJob` plus a READY :class:`~django_jobguard.models.JobResult`; the worker moves the
result through RUNNING to SUCCESSFUL or FAILED.

jobguard's tools come through ``@task`` keyword arguments (Django 6.1 and the backport pass
them to :attr:`JobGuardBackend.task_class`; on Django 6.0 use this module's :func:`task`)::

    @task(unique_for=60, unique_key="product_id", tries=3, backoff=[1, 5],
          middleware=[lambda job: WithoutOverlapping(job.kwargs["product_id"])])
    def reindex(product_id): ...

A worker only runs a function that is, at the stored import path, a ``Task`` object whose
backend is a :class:`JobGuardBackend`; the module must belong to an installed app or be
listed in ``JOBGUARD["JOB_MODULES"]``.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import inspect
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import connections, transaction
from django.utils import timezone

from django_jobguard import results, signals, unique_jobs
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.jobs import Job, dispatch
from django_jobguard.models import JobResult
from django_jobguard.stores import get_store
from django_jobguard.unique_jobs import ShouldBeUnique, ShouldBeUniqueUntilProcessing

try:  # Django >= 6.0
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.base import task as _django_task
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2: the backport (pip install django-jobguard[tasks])
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.base import task as _django_task
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

__all__ = ["InvalidTask", "JobGuardBackend", "JobGuardTask", "TaskJob", "task"]

#: The options jobguard adds to ``@task(...)`` (see :class:`JobGuardTask`).
TASK_OPTIONS = ("unique_for", "unique_key", "unique_until_processing", "unique_via",
                "middleware", "tries", "max_exceptions", "backoff", "timeout",
                "fail_on_timeout")
BACKEND_OPTIONS = ("DATABASE",)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobGuardTask(Task):
    """A ``Task`` with jobguard's options; ``@task(...)`` creates it for this backend."""

    #: Make the task unique: seconds the lock lasts at most (0 = until the task finishes).
    #: ``None`` (default) = not unique, unless ``unique_key`` or ``unique_until_processing``.
    unique_for: float | None = None
    #: What makes two enqueues "the same": the name of an argument of the function, or a
    #: callable taking the task's arguments and returning a string. Default: one per task.
    unique_key: str | Callable[..., Any] | None = None
    #: Release the unique lock when a worker starts the task instead of when it finishes.
    unique_until_processing: bool = False
    #: Store alias holding the unique lock (default ``JOBGUARD["STORE"]``).
    unique_via: str | None = None
    #: Job middleware around the function: instances, or callables ``f(job) -> middleware``
    #: (``job.args`` / ``job.kwargs`` are the task's arguments).
    middleware: tuple[Any, ...] = ()
    #: Runs allowed (0 = unlimited; ``None`` = the worker's ``--tries``).
    tries: int | None = None
    #: Fail after this many exceptions even if tries remain.
    max_exceptions: int | None = None
    #: Seconds before a retry, or a list per attempt (the last repeats).
    backoff: float | tuple[float, ...] | None = None
    #: Seconds the task may run (``None`` = the worker's ``--timeout``; 0 = no limit).
    timeout: float | None = None
    #: Do not retry a task that timed out.
    fail_on_timeout: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.middleware, (list, tuple)):
            object.__setattr__(self, "middleware", tuple(self.middleware))
        if isinstance(self.backoff, list):
            object.__setattr__(self, "backoff", tuple(self.backoff))
        Task.__post_init__(self)  # validates against the backend

    @property
    def is_unique(self) -> bool:
        return (self.unique_for is not None or self.unique_key is not None
                or self.unique_until_processing)

    def unique_id(self, args: list, kwargs: dict) -> str:
        """The part of the unique lock key that comes from these arguments."""
        key = self.unique_key
        if key is None:
            return ""
        if callable(key):
            return str(key(*args, **kwargs))
        params = list(inspect.signature(self.func).parameters)
        if self.takes_context:
            params = params[1:]
        if key in kwargs:
            return str(kwargs[key])
        position = params.index(key)
        if position < len(args):
            return str(args[position])
        default = inspect.signature(self.func).parameters[key].default
        return "" if default is inspect.Parameter.empty else str(default)


def task(function: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``@task`` that accepts jobguard's options on every Django version (Django 6.0's own
    ``@task`` does not pass extra keyword arguments to the backend)."""
    backend = options.get("backend", "default")
    extra = {key: options.pop(key) for key in list(options) if key in TASK_OPTIONS}
    if extra and not isinstance(task_backends[backend], JobGuardBackend):
        raise InvalidTask(f"Task backend {backend!r} is not a JobGuardBackend, so it does not "
                          f"take {sorted(extra)}.")

    def wrapper(func: Callable[..., Any]) -> Task:
        made = _django_task(func, **options)
        return dataclasses.replace(made, **extra) if extra else made

    return wrapper(function) if function is not None else wrapper


# -- resolving a stored task path to its Task, safely ------------------------------------------

class TaskNotAllowedError(LookupError):
    """A stored task path does not name a ``Task`` of a jobguard backend."""


_seen: dict[str, Task] = {}  # module path -> the Task validated in this process


def _importable(module_name: str) -> bool:
    if module_name in sys.modules:
        return True
    listed = {m.split(":")[0] for m in jobguard_settings.JOB_MODULES}
    return module_name in listed or apps.get_containing_app_config(module_name) is not None


def resolve_task(path: str, backend_alias: str) -> Task:
    """The ``Task`` object at ``path``, checked to be a real task bound to a jobguard backend.

    Only modules of installed apps (or ``JOBGUARD["JOB_MODULES"]``) are imported.
    """
    module_name, _, attr = str(path).rpartition(".")
    if not module_name or not _importable(module_name):
        raise TaskNotAllowedError(
            f"{path!r} is not in an installed app or JOBGUARD['JOB_MODULES']; refusing to "
            f"import it.")
    try:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskNotAllowedError(f"Cannot import the module of task {path!r}: {exc}") from exc
    found = getattr(module, attr, None)
    if not isinstance(found, Task):
        raise TaskNotAllowedError(f"{path!r} is not a django.tasks Task (found "
                                  f"{type(found).__name__}); only @task functions run.")
    if found.module_path != path:
        raise TaskNotAllowedError(f"{path!r} refers to the task {found.module_path!r}.")
    for alias in {found.backend, backend_alias}:
        try:
            backend = task_backends[alias]
        except Exception as exc:
            raise TaskNotAllowedError(f"Task backend {alias!r} of {path!r}: {exc}") from exc
        if not isinstance(backend, JobGuardBackend):
            raise TaskNotAllowedError(f"Task {path!r} is bound to backend {alias!r}, which is "
                                      f"not a JobGuardBackend.")
    return found if found.backend == backend_alias else found.using(backend=backend_alias)


# -- the adapter job -----------------------------------------------------------------------


class TaskJob(Job):
    """Runs one enqueued django.tasks task; its result row tracks the task's status."""

    name = "django_jobguard.task"
    keep_result = True
    #: Operators see the task's own dotted name (:func:`registry.display_name`): the queued
    #: payload keeps it as the ``task`` keyword argument, the result row as ``task``.
    display_path = ("kwargs", "task")
    result_display_path = ("task",)

    def __init__(self, task: str, backend: str, args: list, kwargs: dict) -> None:
        self.task_path, self.backend_alias = task, backend
        self.args, self.kwargs = list(args), dict(kwargs)
        self.task: Task | None = None
        self._resolve_error: Exception | None = None
        try:
            self.task = resolve_task(task, backend)
        except TaskNotAllowedError as exc:
            self._resolve_error = exc
            return
        if isinstance(self.task, JobGuardTask):
            for option in ("tries", "max_exceptions", "backoff", "timeout"):
                value = getattr(self.task, option)
                if value is not None:
                    setattr(self, option, list(value) if option == "backoff"
                            and isinstance(value, tuple) else value)
            self.fail_on_timeout = self.task.fail_on_timeout
            self.unique_for = self.task.unique_for or 0

    def __repr__(self) -> str:
        return f"TaskJob({self.task_path})"

    # ShouldBeUnique hooks, used by the unique subclasses below.
    def unique_id(self) -> str:
        key = self.task.unique_id(self.args, self.kwargs) if self.task is not None else ""
        return f"{self.task_path}:{key}"

    def unique_via(self) -> str | None:
        return getattr(self.task, "unique_via", None)

    def middleware(self) -> list[Any]:
        items = getattr(self.task, "middleware", ())
        return [item if hasattr(item, "handle") else item(self) for item in items]

    @property
    def backend(self) -> JobGuardBackend:
        return task_backends[self.backend_alias]

    def handle(self) -> Any:
        if self._resolve_error is not None:
            self.fail(self._resolve_error)
            return None
        backend = self.backend
        context = self.context
        using = context.using if context.worker_id else backend.database
        row = results.mark_running(
            self.job_id, worker_id=context.worker_id or "inline",
            attempt=self.attempts(), using=using,
            defaults={"name": self.name, "queue": self.queue_name,
                      "payload": backend.result_payload(self.task, self.args, self.kwargs)},
        ) if self.job_id else None
        task_result = backend.to_result(row, self.task) if row is not None else None
        if task_result is not None:
            task_started.send(sender=type(backend), task_result=task_result)
        call_args = list(self.args)
        if self.task.takes_context:
            call_args.insert(0, TaskContext(task_result=task_result))
        value = self.task.call(*call_args, **self.kwargs)
        try:
            return _normalize_json(value)
        except (TypeError, ValueError) as exc:
            self.fail(TypeError(f"{self.task_path} returned a {type(value).__name__}, which "
                                f"cannot be stored as JSON: {exc}"))
            return None


class UniqueTaskJob(TaskJob, ShouldBeUnique):
    """A task with a unique option: one copy (per key) queued or running."""

    name = "django_jobguard.task.unique"


class UniqueUntilProcessingTaskJob(TaskJob, ShouldBeUniqueUntilProcessing):
    """A task unique until a worker starts it."""

    name = "django_jobguard.task.unique_until_processing"


TASK_JOB_NAMES = (TaskJob.name, UniqueTaskJob.name, UniqueUntilProcessingTaskJob.name)


def _job_class(task: Task) -> type[TaskJob]:
    if not isinstance(task, JobGuardTask) or not task.is_unique:
        return TaskJob
    return UniqueUntilProcessingTaskJob if task.unique_until_processing else UniqueTaskJob


def _normalize_json(value: Any) -> Any:
    try:
        from django.utils.json import normalize_json
    except ImportError:
        from django_tasks.utils import normalize_json
    return normalize_json(value)


# -- django.tasks signals for jobs run by workers -----------------------------------------------


def _send_finished(job: Any, job_id: str) -> None:
    if not isinstance(job, TaskJob) or job.task is None:
        return
    backend = job.backend
    using = job.context.using if job.context.worker_id else backend.database
    row = JobResult.objects.using(using).filter(id=job_id).first()
    if row is not None:
        task_finished.send(sender=type(backend), task_result=backend.to_result(row, job.task))


def _on_processed(sender: Any, job: Any = None, job_id: str = "", **kwargs: Any) -> None:
    _send_finished(job, job_id)


def _on_failed(sender: Any, job: Any = None, job_id: str = "", **kwargs: Any) -> None:
    _send_finished(job, job_id)


signals.job_processed.connect(_on_processed, dispatch_uid="jobguard-tasks-finished")
signals.job_failed.connect(_on_failed, dispatch_uid="jobguard-tasks-failed")


# -- the backend ---------------------------------------------------------------------------------


class JobGuardBackend(BaseTaskBackend):
    """Runs django.tasks tasks on jobguard's queue; results are kept in ``JobResult``.

    ``OPTIONS``: ``DATABASE`` — alias holding the queue and results (default
    ``JOBGUARD['DATABASE']``, itself ``"default"`` unless set).
    ``QUEUES`` — task queue names allowed (default ``["default"]``; ``[]`` allows any); run
    ``manage.py jobworker --queue <names>`` for them.
    """

    task_class = JobGuardTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self._database: str | None = self.options.get("DATABASE")

    @property
    def database(self) -> str:
        """The alias holding the queue and results (read when used: settings may change)."""
        return queue_database(self._database)

    # -- validation ---------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if isinstance(task, JobGuardTask):
            _validate_options(task)
        _seen[task.module_path] = task

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        errors = list(super().check(**kwargs))
        unknown = sorted(set(self.options) - set(BACKEND_OPTIONS))
        if unknown:
            errors.append(checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS'] has unknown keys {unknown}.",
                hint=f"JobGuardBackend takes {list(BACKEND_OPTIONS)}.", id="jobguard.E010"))
        if self.database not in connections:
            errors.append(checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] = {self.database!r} is not in "
                f"DATABASES.", id="jobguard.E010"))
        retry_after = jobguard_settings.RETRY_AFTER
        for path, found in sorted(_seen.items()):
            timeout = getattr(found, "timeout", None)
            if found.backend == self.alias and timeout and timeout >= retry_after:
                errors.append(checks.Error(
                    f"Task {path} has timeout {timeout} s, not less than "
                    f"JOBGUARD['RETRY_AFTER'] = {retry_after} s.",
                    hint="Raise RETRY_AFTER above the largest timeout.", id="jobguard.E003"))
        return errors

    # -- enqueue ------------------------------------------------------------------------

    def result_payload(self, task: Task, args: list, kwargs: dict) -> dict[str, Any]:
        """What a result row keeps so that ``get_result`` can rebuild the TaskResult."""
        return {"task": task.module_path, "backend": self.alias, "args": args,
                "kwargs": kwargs, "priority": task.priority, "queue_name": task.queue_name,
                "run_after": task.run_after.isoformat() if task.run_after else None}

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Queue ``task`` (in the caller's transaction). A unique task whose lock is held is
        not queued again: the result of the copy already queued is returned instead."""
        self.validate_task(task)
        result = TaskResult(
            task=task, id="", status=TaskResultStatus.READY, enqueued_at=None,
            started_at=None, finished_at=None, last_attempted_at=None, args=list(args),
            kwargs=dict(kwargs), backend=self.alias, errors=[], worker_ids=[],
        )  # normalizes the arguments: TypeError for anything that is not JSON
        job = _job_class(task)(task=task.module_path, backend=self.alias, args=result.args,
                               kwargs=result.kwargs)
        if job._resolve_error is not None:  # a worker would refuse it: say so now
            raise InvalidTask(str(job._resolve_error))
        for _ in range(3):
            enqueued_at = timezone.now()
            with transaction.atomic(using=self.database):
                handle = dispatch(job, queue=task.queue_name, priority=task.priority,
                                  delay=task.run_after, using=self.database)
                if handle:
                    results.create_ready(
                        job_id=handle.id, name=job.name, queue=handle.queue,
                        payload=self.result_payload(task, result.args, result.kwargs),
                        enqueued_at=enqueued_at, using=self.database)
            if handle:
                object.__setattr__(result, "id", handle.id)
                object.__setattr__(result, "enqueued_at", enqueued_at)
                task_enqueued.send(sender=type(self), task_result=result)
                return result
            holder = get_store(job.unique_via()).get_lock(unique_jobs.lock_key(job))
            if holder is None:
                continue  # released meanwhile: try again
            try:
                return self.get_result(holder.owner)
            except TaskResultDoesNotExist:  # the holder's transaction has not committed
                object.__setattr__(result, "id", holder.owner)
                return result
        raise RuntimeError(f"Could not enqueue unique task {task.module_path}: its lock "
                           f"changed hands three times.")

    # -- results ------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        try:
            key = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(f"No task result {result_id!r}.") from None
        row = JobResult.objects.using(self.database).filter(
            id=key, name__in=TASK_JOB_NAMES).first()
        if row is None:
            raise TaskResultDoesNotExist(f"No task result {result_id!r}.")
        try:
            found = resolve_task(row.payload.get("task", ""), row.payload.get("backend",
                                                                             self.alias))
        except TaskNotAllowedError as exc:
            raise TaskResultDoesNotExist(f"Task result {result_id!r} exists but its task "
                                         f"cannot be loaded: {exc}") from exc
        return self.to_result(row, found)

    def wait_for_result(self, result_id: str, timeout: float | None = None) -> TaskResult:
        """``get_result()`` once the task has finished (SUCCESSFUL or FAILED), woken by
        NOTIFY on PostgreSQL, polling elsewhere; ``TimeoutError`` after ``timeout`` seconds.
        ``wait(result)`` does this for a ``TaskResult`` in hand."""
        try:
            results.wait_finished(uuid.UUID(str(result_id)), timeout=timeout,
                                  using=self.database)
        except (ValueError, LookupError):
            raise TaskResultDoesNotExist(f"No task result {result_id!r}.") from None
        return self.get_result(result_id)

    async def await_result(self, result_id: str, timeout: float | None = None) -> TaskResult:
        """:meth:`wait_for_result` for async code (the waiting runs off the event loop, in a
        thread of its own whose database connections are closed when it is done)."""
        from asgiref.sync import sync_to_async
        from django.db import connections

        def wait_and_close() -> TaskResult:
            try:
                return self.wait_for_result(result_id, timeout)
            finally:
                connections.close_all()  # this thread's: nothing else will close them

        return await sync_to_async(wait_and_close, thread_sensitive=False)()

    def to_result(self, row: JobResult, task: Task) -> TaskResult:
        """A ``TaskResult`` from a result row (``task`` is the resolved task object)."""
        payload = row.payload or {}
        run_after = payload.get("run_after")
        task = task.using(priority=payload.get("priority", task.priority),
                          queue_name=payload.get("queue_name") or task.queue_name,
                          run_after=datetime.datetime.fromisoformat(run_after)
                          if run_after else None,
                          backend=payload.get("backend", task.backend))
        result = TaskResult(
            task=task, id=str(row.id), status=TaskResultStatus(row.status),
            enqueued_at=row.enqueued_at, started_at=row.started_at,
            finished_at=row.finished_at, last_attempted_at=row.last_attempted_at,
            args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
            backend=payload.get("backend", self.alias),
            errors=[TaskError(exception_class_path=e.get("exception_class_path", ""),
                              traceback=e.get("traceback", "")) for e in row.errors or []],
            worker_ids=list(row.worker_ids or []),
        )
        object.__setattr__(result, "_return_value", row.return_value)
        return result


def wait(result: TaskResult, timeout: float | None = None) -> TaskResult:
    """Block until ``result``'s task has finished, then ``result.refresh()`` it (and return
    it): ``wait(reindex.enqueue(7), timeout=5).return_value``. ``TimeoutError`` after
    ``timeout`` seconds; ``TypeError`` for a result of another backend."""
    backend = result.task.get_backend()
    if not isinstance(backend, JobGuardBackend):
        raise TypeError(f"wait() needs a result of a JobGuardBackend, not of "
                        f"{type(backend).__name__}.")
    backend.wait_for_result(result.id, timeout)
    result.refresh()
    return result


def _validate_options(task: JobGuardTask) -> None:
    """``InvalidTask`` naming the bad option."""
    def bad(message: str) -> InvalidTask:
        return InvalidTask(f"Task {task.module_path}: {message}")

    number = (int, float)
    if task.unique_for is not None and (not isinstance(task.unique_for, number)
                                        or isinstance(task.unique_for, bool)
                                        or task.unique_for < 0):
        raise bad("unique_for must be seconds (>= 0; 0 = until the task finishes).")
    key = task.unique_key
    if key is not None and not callable(key):
        params = list(inspect.signature(task.func).parameters)[1 if task.takes_context else 0:]
        if not isinstance(key, str) or key not in params:
            raise bad(f"unique_key must be a callable or the name of an argument of the "
                      f"function ({', '.join(params) or 'it has none'}), not {key!r}.")
    if task.unique_via is not None and task.unique_via not in jobguard_settings.STORES:
        raise bad(f"unique_via {task.unique_via!r} is not a key of JOBGUARD['STORES'].")
    for item in task.middleware:
        if isinstance(item, type) or not (hasattr(item, "handle") or callable(item)):
            raise bad(f"middleware items must be middleware instances or callables "
                      f"f(job) -> middleware, not {item!r}.")
    for option in ("tries", "max_exceptions"):
        value = getattr(task, option)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise bad(f"{option} must be a whole number >= 0, not {value!r}.")
    steps = task.backoff if isinstance(task.backoff, tuple) else (task.backoff,)
    if task.backoff is not None and not all(
            isinstance(s, number) and not isinstance(s, bool) and s >= 0 for s in steps):
        raise bad(f"backoff must be seconds or a list of seconds, not {task.backoff!r}.")
    if task.timeout is not None and (not isinstance(task.timeout, number) or task.timeout < 0):
        raise bad(f"timeout must be seconds >= 0, not {task.timeout!r}.")
