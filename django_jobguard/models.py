"""Tables: the queue, failed jobs, locks, throttle counters and worker heartbeats.

The schema is designed once for every feature so that upgrades do not need a migration per
feature. All times that decide visibility or expiry are written with the database clock.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class QueuedJob(models.Model):
    """One job waiting, delayed or reserved.

    A reserved job keeps ``available_at`` in the future (its lease): when a worker dies the
    lease runs out and the row is claimable again, with no separate recovery query.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.CharField(_("queue"), max_length=100, default="default")
    name = models.CharField(_("job name"), max_length=255)
    payload = models.JSONField(_("payload"), default=dict)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    exceptions = models.PositiveIntegerField(_("exceptions"), default=0)
    priority = models.SmallIntegerField(_("priority"), default=0)
    available_at = models.DateTimeField(_("available at"), db_default=Now())
    reserved_at = models.DateTimeField(_("reserved at"), null=True, blank=True)
    reserved_by = models.CharField(_("reserved by"), max_length=100, blank=True, default="")
    last_error = models.TextField(_("last error"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), db_default=Now())

    class Meta:
        verbose_name = _("queued job")
        verbose_name_plural = _("queued jobs")
        indexes = [
            # Serves the claim query: WHERE queue = ? AND available_at <= now
            # ORDER BY priority DESC, available_at.
            models.Index(
                fields=["queue", "-priority", "available_at"], name="jobguard_claim_idx"
            ),
            models.Index(fields=["name"], name="jobguard_job_name_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=-100) & Q(priority__lte=100),
                name="jobguard_priority_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.id}]"

    @property
    def state(self) -> str:
        """``reserved``, ``delayed`` or ``waiting`` (evaluated with this process's clock)."""
        from django.utils import timezone

        now = timezone.now()
        if self.reserved_at is not None and self.available_at > now:
            return "reserved"
        if self.available_at > now:
            return "delayed"
        return "waiting"


class FailedJob(models.Model):
    """A job that used up its attempts or failed explicitly, kept for inspection and retry."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.CharField(_("queue"), max_length=100)
    name = models.CharField(_("job name"), max_length=255)
    payload = models.JSONField(_("payload"), default=dict)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    priority = models.SmallIntegerField(_("priority"), default=0)
    exception_class = models.CharField(_("exception class"), max_length=255, blank=True)
    message = models.TextField(_("message"), blank=True)
    traceback = models.TextField(_("traceback"), blank=True)
    last_error = models.TextField(_("last error before failing"), blank=True, default="")
    failed_at = models.DateTimeField(_("failed at"), db_default=Now())

    class Meta:
        verbose_name = _("failed job")
        verbose_name_plural = _("failed jobs")
        ordering = ["-failed_at"]
        indexes = [models.Index(fields=["failed_at"], name="jobguard_failed_at_idx")]

    def __str__(self) -> str:
        return f"{self.name} [{self.id}]: {self.exception_class}"


class Lock(models.Model):
    """A named lock held by ``owner`` until released or ``expires_at``.

    The row stays after release (``owner`` empty) so that ``token`` keeps counting up: each
    acquire returns a larger fencing token than any earlier holder of the key had.
    """

    key = models.CharField(_("key"), max_length=255, unique=True)
    owner = models.CharField(_("owner"), max_length=100, blank=True, default="")
    token = models.BigIntegerField(_("fencing token"), default=0)
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    job_id = models.CharField(_("job id"), max_length=64, blank=True, default="")

    class Meta:
        verbose_name = _("lock")
        verbose_name_plural = _("locks")
        indexes = [models.Index(fields=["expires_at"], name="jobguard_lock_expiry_idx")]

    def __str__(self) -> str:
        return self.key


class Throttle(models.Model):
    """Counter state for a rate-limit window or an exception circuit, keyed by name."""

    key = models.CharField(_("key"), max_length=255, unique=True)
    kind = models.CharField(_("kind"), max_length=20)
    hits = models.IntegerField(_("hits"), default=0)
    limit = models.IntegerField(_("limit"), default=0)
    state = models.CharField(_("state"), max_length=20, blank=True, default="")
    value = models.FloatField(_("value"), default=0.0)
    resets_at = models.DateTimeField(_("resets at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"), db_default=Now())

    class Meta:
        verbose_name = _("throttle")
        verbose_name_plural = _("throttles")
        indexes = [models.Index(fields=["expires_at"], name="jobguard_throttle_expiry_idx")]

    def __str__(self) -> str:
        return self.key


class Worker(models.Model):
    """A running worker process; ``last_seen_at`` is its heartbeat."""

    id = models.CharField(primary_key=True, max_length=100)
    hostname = models.CharField(_("hostname"), max_length=255)
    pid = models.IntegerField(_("pid"))
    queues = models.CharField(_("queues"), max_length=255)
    started_at = models.DateTimeField(_("started at"), db_default=Now())
    last_seen_at = models.DateTimeField(_("last seen at"), db_default=Now())
    current_job = models.CharField(_("current job"), max_length=64, blank=True, default="")
    jobs_processed = models.PositiveIntegerField(_("jobs processed"), default=0)
    # Jobs this worker finished in the 60 s before its last heartbeat (for the stats API).
    done_last_minute = models.PositiveIntegerField(_("done in the last minute"), default=0)
    failed_last_minute = models.PositiveIntegerField(_("failed in the last minute"), default=0)

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.id


class JobResult(models.Model):
    """The state and outcome of a job that keeps results (django.tasks tasks do).

    ``status`` goes READY (queued) → RUNNING → SUCCESSFUL or FAILED, back to READY when a
    retry is queued. Finished rows are pruned after ``JOBGUARD['RESULT_RETENTION_DAYS']``.
    """

    id = models.UUIDField(primary_key=True, editable=False)
    name = models.CharField(_("job name"), max_length=255)
    queue = models.CharField(_("queue"), max_length=100)
    status = models.CharField(_("status"), max_length=20)
    return_value = models.JSONField(_("return value"), null=True, blank=True)
    errors = models.JSONField(_("errors"), default=list, blank=True)
    worker_ids = models.JSONField(_("worker ids"), default=list, blank=True)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    #: What ran: for django.tasks, the task's path, backend, arguments, priority and run_after.
    payload = models.JSONField(_("payload"), default=dict, blank=True)
    enqueued_at = models.DateTimeField(_("enqueued at"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    last_attempted_at = models.DateTimeField(_("last attempted at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("job result")
        verbose_name_plural = _("job results")
        indexes = [models.Index(fields=["finished_at"], name="jobguard_result_finished_idx")]

    def __str__(self) -> str:
        return f"{self.name} [{self.id}]: {self.status}"
