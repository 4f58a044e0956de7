"""Pausing and resuming queues: persisted as :class:`PausedQueue` rows that every dialect's
claim statement excludes, with a NOTIFY so that listening workers notice a resume at once."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from django_jobguard import queue as job_queue
from django_jobguard import registry
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.models import FailedJob, PausedQueue, QueuedJob, Worker
from django_jobguard.operations import audit

QUEUE_NAME = job_queue.QUEUE_NAME


class QueueNameError(ValueError):
    """A queue name that is malformed, unknown (pause without ``force``) or not paused."""


def check_queue_name(name: str) -> str:
    """``name`` stripped, or :class:`QueueNameError` saying what is wrong with it."""
    name = (name or "").strip()
    if not QUEUE_NAME.fullmatch(name):
        raise QueueNameError(f"Invalid queue name {name!r}: 1 to 100 characters, without "
                             f"spaces or commas.")
    return name


def is_known_queue(name: str, *, using: str | None = None) -> bool:
    """Whether ``name`` is a queue jobguard has heard of: the default queue, a registered
    job's queue, a queue with queued or failed jobs, or one a worker serves."""
    using = queue_database(using)
    if name == jobguard_settings.DEFAULT_QUEUE:
        return True
    if any(getattr(job, "queue", None) == name for job in registry.all_jobs().values()):
        return True
    if QueuedJob.objects.using(using).filter(queue=name).exists():
        return True
    if FailedJob.objects.using(using).filter(queue=name).exists():
        return True
    return any(name in row.split(",") for row in
               Worker.objects.using(using).values_list("queues", flat=True))


def known_queues(*, using: str | None = None, limit: int = 1000) -> set[str]:
    """The queues :func:`is_known_queue` knows (up to ``limit`` from each table), to suggest
    one for a mistyped name."""
    using = queue_database(using)
    names = {jobguard_settings.DEFAULT_QUEUE}
    names.update(q for job in registry.all_jobs().values()
                 if isinstance(q := getattr(job, "queue", None), str))
    for model in (QueuedJob, FailedJob):
        names.update(model.objects.using(using).order_by().values_list(
            "queue", flat=True).distinct()[:limit])
    for row in Worker.objects.using(using).values_list("queues", flat=True)[:limit]:
        names.update(row.split(","))
    return names


def pause(name: str, *, force: bool = False, actor: str = "", using: str | None = None,
          force_hint: str = 'send "force": true') -> bool:
    """Stop workers claiming from queue ``name`` (running jobs finish); False if it was
    paused already. An unknown queue is refused unless ``force`` (to pause ahead of time);
    ``force_hint`` says how the caller's user passes it (``"pass --force"``, ``""``: not at
    all)."""
    using = queue_database(using)
    name = check_queue_name(name)
    if not force and not is_known_queue(name, using=using):
        hint = f" ({force_hint} to pause it ahead of time)" if force_hint else ""
        raise QueueNameError(f"Unknown queue {name!r}: no job, worker or registered job uses "
                             f"it{hint}.")
    try:
        with transaction.atomic(using=using):
            PausedQueue.objects.using(using).create(queue=name, paused_by=actor[:150])
    except IntegrityError:
        return False
    audit.record("pause", 1, f"Paused queue {name!r}", actor)
    return True


def resume(name: str, *, actor: str = "", using: str | None = None) -> None:
    """Let workers claim from ``name`` again, waking listening workers;
    :class:`QueueNameError` if it was not paused."""
    using = queue_database(using)
    name = check_queue_name(name)
    with transaction.atomic(using=using):
        deleted, _ = PausedQueue.objects.using(using).filter(queue=name).delete()
        if not deleted:
            raise QueueNameError(f"Queue {name!r} is not paused.")
        job_queue.notify([name], using=using)
    audit.record("resume", 1, f"Resumed queue {name!r}", actor)


def paused_queues(*, using: str | None = None) -> list[PausedQueue]:
    """The paused queues, by name."""
    using = queue_database(using)
    return list(PausedQueue.objects.using(using).order_by("queue"))
