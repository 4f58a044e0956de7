"""Tables: the queue, failed jobs, locks, throttle counters and worker heartbeats.

The schema is designed once for every feature so that upgrades do not need a migration per
feature. All times that decide visibility or expiry are written with the database clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.db import models
from django.db.models import Case, CharField, Count, F, Q, Value, When
from django.db.models.functions import Now
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from django_jobguard import clock
from django_jobguard.tags import COLUMN_LENGTH as TAGS_LENGTH

#: The states of a queued job. *waiting*: due now; *delayed*: due later; *reserved*: a worker
#: holds it (its lease, ``available_at``, has not run out). Judged by the database clock.
STATES = ("waiting", "delayed", "reserved")

#: The most a queued row's counters (``attempts``, ``exceptions``, ``claims``) count to: the
#: largest value a ``PositiveIntegerField`` holds on every database. A claim never adds past
#: it; a row that reached it is quarantined (failed with a reason) instead of overflowing.
COUNTER_MAX = 2**31 - 1

#: The annotation :meth:`QueuedJobQuerySet.with_state` adds.
STATE_ANNOTATION = "jobguard_state"

#: The permission to see jobs' arguments (payloads may hold personal data): without it the
#: admin and the API show jobs, failures and runs with their arguments hidden and refuse
#: searches by argument. Superusers have it, like every permission.
VIEW_ARGUMENTS = "django_jobguard.view_job_arguments"


def may_view_arguments(user: Any) -> bool:
    """Whether ``user`` (a request's, maybe anonymous or ``None``) may see job arguments."""
    return bool(user is not None and user.has_perm(VIEW_ARGUMENTS))


def _plain_name(name: str, payload: Any, *, result: bool = False) -> str:
    return name


#: How a row's job name is shown (a django.tasks task's dotted path, not its adapter's):
#: :func:`django_jobguard.registry.display_name`, set by ``apps.ready()`` so that the models,
#: the lowest layer, import nothing above them.
display_name: Callable[..., str] = _plain_name


def _state_condition(state: str) -> Q:
    """The one definition of each state, as SQL on the database clock."""
    if state == "reserved":
        return Q(reserved_at__isnull=False, available_at__gt=clock.db_now())
    if state == "delayed":
        return Q(reserved_at__isnull=True, available_at__gt=clock.db_now())
    if state == "waiting":
        return Q(available_at__lte=clock.db_now())
    raise ValueError(f"Unknown state {state!r}; expected one of {', '.join(STATES)}.")


class QueuedJobQuerySet(models.QuerySet):
    """Queued jobs by state, every state judged in SQL by the database clock (app servers
    with skewed clocks agree)."""

    def waiting(self) -> QueuedJobQuerySet:
        """Jobs due now (a reserved job whose lease ran out is due again)."""
        return self.filter(_state_condition("waiting"))

    def delayed(self) -> QueuedJobQuerySet:
        """Jobs not due yet that no worker holds."""
        return self.filter(_state_condition("delayed"))

    def reserved(self) -> QueuedJobQuerySet:
        """Jobs a worker holds (their lease has not run out)."""
        return self.filter(_state_condition("reserved"))

    def unreserved(self) -> QueuedJobQuerySet:
        """Waiting and delayed jobs: the ones an operator may delete or make due."""
        return self.exclude(_state_condition("reserved"))

    def in_state(self, state: str) -> QueuedJobQuerySet:
        """Jobs in ``state``, one of :data:`STATES` (``ValueError`` naming them otherwise)."""
        return self.filter(_state_condition(state))

    def with_state(self) -> QueuedJobQuerySet:
        """Annotate each row's state as ``jobguard_state`` (``row.state`` then reads it)."""
        return self.annotate(**{STATE_ANNOTATION: Case(
            *(When(_state_condition(state), then=Value(state)) for state in STATES),
            output_field=CharField(),
        )})

    def state_counts(self) -> dict[str, dict[str, int]]:
        """``{queue: {"waiting": n, "delayed": n, "reserved": n}}`` in one query."""
        rows = self.order_by().values("queue").annotate(**{
            state: Count("id", filter=_state_condition(state)) for state in STATES})
        return {row["queue"]: {state: row[state] for state in STATES} for row in rows}


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
    #: Why a deferred job waits (``circuit 'sms' was open``), for operators; empty otherwise.
    wait_reason = models.CharField(_("waiting because"), max_length=255, blank=True,
                                   default="", db_default="")
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    #: When an operator asked the running job to stop (``job.cancelled`` then says so).
    cancel_requested_at = models.DateTimeField(_("cancel requested at"), null=True, blank=True)
    #: What the running job last reported with ``self.progress(fraction, message)``.
    progress = models.FloatField(_("progress"), null=True, blank=True)
    progress_message = models.CharField(_("progress message"), max_length=255, blank=True,
                                        default="", db_default="")
    #: How many times the row was claimed: every claim adds one. Writes of a claimed row check
    #: it with ``reserved_by``, so a late write of an attempt the worker already ended (a
    #: stuck thread, see executor.py) cannot touch a later claim of the row by the same worker.
    claims = models.PositiveIntegerField(_("claims"), default=0, db_default=0, editable=False)
    #: A debounced job's key (``jobguard:debounce:<job name>:<debounce id>``): dispatches of
    #: the same key while this row waits fold into it (:mod:`django_jobguard.debounce`).
    debounce_key = models.CharField(_("debounce key"), max_length=255, null=True, blank=True,
                                    editable=False)
    #: The latest time folding may push ``available_at`` to: first dispatch + ``max_wait``.
    debounce_deadline = models.DateTimeField(_("debounce deadline"), null=True, blank=True,
                                             editable=False)
    #: How many later dispatches were folded into this row (their arguments replaced its own).
    debounce_folds = models.PositiveIntegerField(_("dispatches folded"), default=0,
                                                 db_default=0, editable=False)
    #: ``debounce_key`` while no worker has taken the row, else NULL; kept by the database
    #: and unique (``jobguard_debounce_slot_uniq``), so that at most one row per key waits to
    #: be folded into, on every database (MariaDB has no partial indexes: a unique generated
    #: column does the same).
    debounce_slot = models.GeneratedField(
        expression=Case(When(reserved_at__isnull=True, then=F("debounce_key")),
                        default=Value(None), output_field=CharField(max_length=255)),
        output_field=CharField(max_length=255, null=True), db_persist=True)

    #: An iterable job's checkpoint, ``{"cursor": ..., "done": n}``: written in the
    #: transaction of each item's own writes; the next run resumes after it.
    checkpoint = models.JSONField(_("checkpoint"), null=True, blank=True, editable=False)
    #: The job's tags as ``,billing,urgent,`` (:mod:`django_jobguard.tags`); empty without.
    tags = models.CharField(_("tags"), max_length=TAGS_LENGTH, blank=True, default="",
                            db_default="", editable=False)
    #: The key (a tenant, a customer) a fair queue takes turns between: its claims serve
    #: keys in (weighted) round robin (:mod:`django_jobguard.fair_share`); "" is a key too.
    fair_key = models.CharField(_("fair key"), max_length=255, blank=True, default="",
                                db_default="", editable=False)

    objects = QueuedJobQuerySet.as_manager()

    # Set on a claimed row, not columns (annotations only: absent until the claim sets them).
    #: Whether the claim counted this row's attempt (False: claimed ahead, counted at start).
    attempt_counted: bool
    #: Whether the claim took the row from a holder whose lease ran out (PostgreSQL claims
    #: say; elsewhere absent): a worker that vanished, or a stale one.
    recovered: bool
    #: The length of the row's stored payload text, as the claim read it.
    payload_text_length: int | None

    class Meta:
        verbose_name = _("queued job")
        verbose_name_plural = _("queued jobs")
        permissions = [("view_job_arguments", _("Can view the arguments (payloads) of jobs, "
                                                "failed jobs and finished runs"))]
        indexes = [
            # Serves the claim query: WHERE queue = ? AND available_at <= now
            # ORDER BY priority DESC, available_at.
            models.Index(
                fields=["queue", "-priority", "available_at"], name="jobguard_claim_idx"
            ),
            models.Index(fields=["name"], name="jobguard_job_name_idx"),
            # Serves a fair queue's claim: the next key with a due row, and each key's rows
            # in claim order (fair_share.py), and the per-key count of reserved rows.
            models.Index(fields=["queue", "fair_key", "-priority", "available_at"],
                         name="jobguard_fair_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=-100) & Q(priority__lte=100),
                name="jobguard_priority_range",
            ),
            # A constraint, not ``unique=True``: on PostgreSQL that would add a second index
            # (``varchar_pattern_ops``, for LIKE) which every claim and insert writes too.
            models.UniqueConstraint(fields=["debounce_slot"], name="jobguard_debounce_slot_uniq"),
        ]

    def __str__(self) -> str:
        return f"{display_name(self.name, self.payload)} [{self.id}]"

    @property
    def state(self) -> str:
        """``waiting``, ``delayed`` or ``reserved`` on the database clock: the annotation of
        :meth:`QueuedJobQuerySet.with_state` when the row was loaded with it, else one query.

        ``QueuedJob.DoesNotExist`` if the row is no longer queued.
        """
        state = getattr(self, STATE_ANNOTATION, None)
        if state is None:
            state = type(self)._default_manager.using(self._state.db).filter(
                pk=self.pk).with_state().values_list(STATE_ANNOTATION, flat=True).get()
        return state


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
    #: Which limit ended the job (``its last try (3 of 3) raised``, ``retry deadline … passed``).
    reason = models.CharField(_("reason"), max_length=500, blank=True, default="")
    #: The last exception the job itself raised, with its traceback (whatever ended it).
    last_error = models.TextField(_("last error"), blank=True, default="")
    failed_at = models.DateTimeField(_("failed at"), db_default=Now())
    #: The job's tags as ``,billing,urgent,`` (:mod:`django_jobguard.tags`); empty without.
    tags = models.CharField(_("tags"), max_length=TAGS_LENGTH, blank=True, default="",
                            db_default="", editable=False)
    #: The queued row's ``fair_key``, given back to it when the job is retried.
    fair_key = models.CharField(_("fair key"), max_length=255, blank=True, default="",
                                db_default="", editable=False)

    class Meta:
        verbose_name = _("failed job")
        verbose_name_plural = _("failed jobs")
        ordering = ["-failed_at"]
        indexes = [models.Index(fields=["failed_at"], name="jobguard_failed_at_idx")]

    def __str__(self) -> str:
        shown = display_name(self.name, self.payload)
        return f"{shown} [{self.id}]: {self.exception_class}"


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
    #: The exact state both stores keep (see stores/counters.py): a rate window's hit log, or
    #: a circuit's state, failures, deadline and probe. The other columns mirror it for people.
    data = models.TextField(_("data"), blank=True, default="")
    resets_at = models.DateTimeField(_("resets at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"), db_default=Now())

    class Meta:
        verbose_name = _("throttle")
        verbose_name_plural = _("throttles")
        indexes = [models.Index(fields=["expires_at"], name="jobguard_throttle_expiry_idx")]

    def __str__(self) -> str:
        return self.key


#: What an operator may ask of a worker, in order: a ``stop`` overrides a ``quiet``.
QUIET, STOP = "quiet", "stop"
WORKER_COMMANDS = (QUIET, STOP)


class Worker(models.Model):
    """A running worker process; ``last_seen_at`` is its heartbeat."""

    id = models.CharField(primary_key=True, max_length=100)
    hostname = models.CharField(_("hostname"), max_length=255)
    pid = models.IntegerField(_("pid"))
    queues = models.CharField(_("queues"), max_length=255)
    started_at = models.DateTimeField(_("started at"), db_default=Now())
    last_seen_at = models.DateTimeField(_("last seen at"), db_default=Now())
    #: The ids of the jobs it runs now, comma separated (several with ``--threads``).
    current_job = models.TextField(_("current job"), blank=True, default="")
    jobs_processed = models.PositiveIntegerField(_("jobs processed"), default=0)
    # Jobs this worker finished in the 60 s before its last heartbeat (for the stats API).
    done_last_minute = models.PositiveIntegerField(_("done in the last minute"), default=0)
    failed_last_minute = models.PositiveIntegerField(_("failed in the last minute"), default=0)
    #: What an operator asked of the worker (:data:`WORKER_COMMANDS`): ``quiet`` (claim
    #: nothing new, let the running jobs finish) or ``stop`` (a graceful stop); empty for
    #: none. Its heartbeat reads it: delivered through the database, so to any host.
    command = models.CharField(_("command"), max_length=10, blank=True, default="",
                               db_default="")
    command_by = models.CharField(_("command by"), max_length=150, blank=True, default="",
                                  db_default="")
    command_at = models.DateTimeField(_("command at"), null=True, blank=True)
    #: What the worker does, as it last wrote: ``running``, ``quiet`` or ``stopping``.
    state = models.CharField(_("state"), max_length=10, blank=True, default="running",
                             db_default="running")

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        permissions = [("quiet_worker", _("Can quiet workers (they claim nothing new)")),
                       ("stop_worker", _("Can stop workers (a graceful stop)"))]

    def __str__(self) -> str:
        return self.id


class QueueGate(models.Model):
    """The row every claim of a queue with a ``global_concurrency`` (``JOBGUARD["QUEUES"]``)
    locks while it counts the queue's running jobs and claims, so that claims of that queue
    from all workers and hosts take turns and never run more than the cap at once."""

    queue = models.CharField(_("queue"), max_length=100, primary_key=True)
    claimed_at = models.DateTimeField(_("last claimed at"), null=True, blank=True)

    class Meta:
        verbose_name = _("queue gate")
        verbose_name_plural = _("queue gates")

    def __str__(self) -> str:
        return self.queue


class PausedQueue(models.Model):
    """A queue that workers do not claim from until it is resumed (its row deleted).

    The claim statement of every dialect excludes paused queues, so a pause holds from the
    first claim after it commits; jobs already running finish.
    """

    queue = models.CharField(_("queue"), max_length=100, primary_key=True)
    paused_at = models.DateTimeField(_("paused at"), db_default=Now())
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")

    class Meta:
        verbose_name = _("paused queue")
        verbose_name_plural = _("paused queues")

    def __str__(self) -> str:
        return self.queue


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
        shown = display_name(self.name, self.payload, result=True)
        return f"{shown} [{self.id}]: {self.status}"


class ScheduleTick(models.Model):
    """One tick of a periodic schedule, enqueued (or skipped) once: the unique row per
    (schedule, tick) is what lets every worker run the scheduler without a leader."""

    schedule = models.CharField(_("schedule"), max_length=200)
    #: The instant the tick was due (UTC), whatever time zone the schedule is written in.
    tick = models.DateTimeField(_("tick"))
    job_id = models.CharField(_("job id"), max_length=64, blank=True, default="")
    #: Why no job was queued: ``unique`` (a copy still queued) or ``missed`` (catch_up none).
    skipped = models.CharField(_("skipped"), max_length=50, blank=True, default="")
    enqueued_at = models.DateTimeField(_("enqueued at"), db_default=Now())

    class Meta:
        verbose_name = _("schedule run")
        verbose_name_plural = _("schedule runs")
        permissions = [("run_schedule", _("Can run a periodic job now (outside its ticks)"))]
        ordering = ["-tick"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "tick"], name="jobguard_schedule_tick"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.tick.isoformat()}"


class Chain(models.Model):
    """Jobs that run one after another (``chain(A(), B()).dispatch()``).

    ``links`` holds each link's job name, queue, priority, payload, id and status (``pending``
    → ``queued`` → ``done``; ``failed``; ``cancelled`` after a failed link). The next link is
    queued in the transaction that acks the previous one.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(_("name"), max_length=255, blank=True, default="")
    #: ``running``, ``completed`` or ``failed`` (retrying the failed link: ``running`` again).
    status = models.CharField(_("status"), max_length=20, default="running")
    links = models.JSONField(_("links"), default=list)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("chain")
        verbose_name_plural = _("chains")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name or str(self.id)


class Batch(models.Model):
    """Jobs dispatched together, with callbacks when they are done
    (``batch([...]).then(A()).catch(B()).finally_(C()).dispatch()``; Laravel's ``Bus::batch``).

    The counts are Laravel's: ``pending_jobs`` goes down when a job succeeds (or is skipped
    because the batch was cancelled), ``failed_jobs`` up when one fails for good; the
    callbacks are queued in the transaction that records the job that completes them.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(_("name"), max_length=255, blank=True, default="")
    total_jobs = models.PositiveIntegerField(_("total jobs"), default=0)
    pending_jobs = models.PositiveIntegerField(_("pending jobs"), default=0)
    failed_jobs = models.PositiveIntegerField(_("failed jobs"), default=0)
    failed_job_ids = models.JSONField(_("failed job ids"), default=list, blank=True)
    allow_failures = models.BooleanField(_("allow failures"), default=False)
    #: ``{"then": [job], "catch": [job], "finally": [job]}``: each job as queued, encoded.
    callbacks = models.JSONField(_("callbacks"), default=dict, blank=True)
    #: Which callbacks were queued (each at most once).
    callbacks_queued = models.JSONField(_("callbacks queued"), default=list, blank=True)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    cancelled_at = models.DateTimeField(_("cancelled at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name or str(self.id)

    @property
    def processed_jobs(self) -> int:
        """Jobs that ran (succeeded or were skipped) or failed: ``total - pending`` plus
        the failed ones still counted as pending."""
        return self.total_jobs - self.pending_jobs + self.failed_jobs

    @property
    def progress(self) -> float:
        """Share of the jobs processed, 0 to 1 (1 for an empty batch)."""
        return min(1.0, self.processed_jobs / self.total_jobs) if self.total_jobs else 1.0

    @property
    def all_ran(self) -> bool:
        """Every job has run once (a failed one stays counted in ``pending_jobs``)."""
        return self.pending_jobs <= self.failed_jobs

    @property
    def finished(self) -> bool:
        """Every job has run: succeeded, failed for good, or skipped (cancelled)."""
        return self.finished_at is not None

    @property
    def status(self) -> str:
        """``running``; or, once finished: ``completed`` (every job succeeded), ``failed``
        or ``cancelled``."""
        if self.cancelled_at is not None and not self.finished:
            return "cancelling"
        if not self.finished:
            return "running"
        if self.failed_jobs:
            return "failed"
        return "cancelled" if self.cancelled_at is not None else "completed"

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at is not None


class QueueMinute(models.Model):
    """Jobs of one queue that finished (``done``) or failed for good in one minute, as the
    workers counted them: each worker adds its counts since its last heartbeat to the row
    of the current minute (database clock) in one upsert. The dashboard's history charts
    read these rows; the workers' housekeeping deletes them after two days
    (:data:`django_jobguard.history.KEEP`)."""

    minute = models.DateTimeField(_("minute"))
    queue = models.CharField(_("queue"), max_length=100)
    done = models.PositiveIntegerField(_("done"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)

    class Meta:
        verbose_name = _("queue minute")
        verbose_name_plural = _("queue minutes")
        constraints = [
            # The upsert's conflict target; its leading column serves the time-range reads
            # and the pruning.
            models.UniqueConstraint(fields=["minute", "queue"], name="jobguard_queue_minute"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} @ {self.minute.isoformat()}: {self.done} done, {self.failed} failed"


class Dashboard(QueuedJob):
    """No data of its own: gives the admin's dashboard page (``django_jobguard.admin.dashboard``)
    its place in the app's section. Who may see it is asked of the queued jobs' view
    permission, so it needs no permissions of its own."""

    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = _("dashboard")
        # The admin index lists an app's models sorted by this name; the leading space (not
        # shown in HTML) puts the dashboard first, above "Batches".
        verbose_name_plural = format_lazy(" {}", _("Dashboard"))


class FinishedRun(models.Model):
    """One finished run of a job (done, failed, cancelled, skipped or deleted), kept when
    ``JOBGUARD["HISTORY"]`` asks for it: workers buffer the runs they finish and insert them in
    bulk at each heartbeat (:mod:`django_jobguard.history`); housekeeping deletes the rows older
    than ``HISTORY_RETENTION_DAYS`` in bounded batches."""

    job_id = models.UUIDField(_("job id"))
    state = models.CharField(_("state"), max_length=20)
    name = models.CharField(_("job name"), max_length=255)
    queue = models.CharField(_("queue"), max_length=100)
    #: ``{"args": [...], "kwargs": {...}}`` as the job was dispatched.
    arguments = models.JSONField(_("arguments"), default=dict)
    attempt = models.PositiveIntegerField(_("attempt"), default=0)
    worker = models.CharField(_("worker"), max_length=100, blank=True, default="")
    started_at = models.DateTimeField(_("started at"))
    finished_at = models.DateTimeField(_("finished at"))
    #: Seconds from the start of the row's processing to its outcome (as the job line shows).
    runtime = models.FloatField(_("runtime (s)"), null=True, blank=True)
    #: Seconds from when the job became due to the start of this run.
    wait = models.FloatField(_("wait (s)"), null=True, blank=True)
    #: Bytes of the return value's JSON; null when it returned None or did not succeed.
    result_size = models.PositiveIntegerField(_("result size"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True, default="")
    #: The job's tags as ``,billing,urgent,`` (:mod:`django_jobguard.tags`); empty without.
    tags = models.CharField(_("tags"), max_length=TAGS_LENGTH, blank=True, default="",
                            db_default="", editable=False)

    class Meta:
        verbose_name = _("finished run")
        verbose_name_plural = _("finished runs")
        ordering = ["-finished_at"]
        indexes = [
            # The lists, the time range, the pruning and the statistics read by finished_at.
            models.Index(fields=["finished_at"], name="jobguard_run_finished_idx"),
            models.Index(fields=["name", "finished_at"], name="jobguard_run_name_idx"),
            # The failures (the admin's state filter, the dashboard's failure links): their
            # count and pages without a scan of every run; only failed runs are in it.
            models.Index(fields=["finished_at"], condition=models.Q(state="FAILED"),
                         name="jobguard_run_failed_idx"),
        ]
        constraints = [
            # A flush retried after an ambiguous error inserts the same rows again: ignored.
            models.UniqueConstraint(fields=["job_id", "finished_at"], name="jobguard_run_once"),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.job_id}] {self.state} at {self.finished_at.isoformat()}"


#: The columns of a :class:`RunStatistic` row, in the order the history and the dialects
#: pass its values (``history.py`` builds them, ``Dialect.add_run_statistics`` writes them).
STATISTIC_COLUMNS = ("span", "period", "name", "queue", "bucket", "runs", "failures",
                     "runtimes", "waits", "runtime_min", "runtime_max", "wait_min", "wait_max")


class RunStatistic(models.Model):
    """Finished runs of one job class and queue in one minute (``span`` 60) or one hour
    (``span`` 3600), pre-aggregated when the runs are inserted
    (:func:`django_jobguard.history.insert_runs`) so that the statistics of a week of history
    read a few thousand rows instead of every run (:func:`~django_jobguard.history.run_statistics`).

    ``bucket`` -1 is the period's summary row (``runs``, ``failures``, the smallest and
    largest runtime and wait); a bucket ``b >= 0`` row counts the runs whose runtime
    (``runtimes``) or wait (``waits``) fell in histogram bucket ``b``
    (:func:`~django_jobguard.history.bucket_of`). Every write is an additive upsert, so
    concurrent workers' counts all add up. Housekeeping deletes minute rows after two days and
    hour rows with the runs (``HISTORY_RETENTION_DAYS``)."""

    span = models.PositiveIntegerField(_("span (s)"))
    period = models.DateTimeField(_("period"))
    name = models.CharField(_("job name"), max_length=255)
    queue = models.CharField(_("queue"), max_length=100)
    bucket = models.SmallIntegerField(_("bucket"))
    runs = models.PositiveIntegerField(_("runs"), default=0)
    failures = models.PositiveIntegerField(_("failures"), default=0)
    runtimes = models.PositiveIntegerField(_("runtimes in the bucket"), default=0)
    waits = models.PositiveIntegerField(_("waits in the bucket"), default=0)
    runtime_min = models.FloatField(_("shortest runtime (s)"), null=True, blank=True)
    runtime_max = models.FloatField(_("longest runtime (s)"), null=True, blank=True)
    wait_min = models.FloatField(_("shortest wait (s)"), null=True, blank=True)
    wait_max = models.FloatField(_("longest wait (s)"), null=True, blank=True)

    class Meta:
        verbose_name = _("run statistic")
        verbose_name_plural = _("run statistics")
        constraints = [
            # The upsert's conflict target; (span, period) leads: the window reads and the
            # pruning are ranges of it.
            models.UniqueConstraint(fields=["span", "period", "name", "queue", "bucket"],
                                    name="jobguard_run_statistic"),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.queue}] {self.period.isoformat()}/{self.span}s #{self.bucket}"


class QueueAlert(models.Model):
    """The state of one queue's service-level objective (``JOBGUARD["QUEUES"][queue]``'s
    ``max_wait`` or ``max_failure_rate``): breached or not, and the value and threshold at
    its last change. Workers evaluate the objectives at housekeeping and change ``breached``
    with a conditional UPDATE (``WHERE breached = <old>``), so of several workers that see
    one crossing, exactly one wins the update and sends the signal and webhook
    (:mod:`django_jobguard.slo`)."""

    queue = models.CharField(_("queue"), max_length=100)
    #: ``"max_wait"`` or ``"max_failure_rate"``.
    slo = models.CharField(_("objective"), max_length=30)
    breached = models.BooleanField(_("breached"), default=False)
    #: The measured value (seconds, or a rate 0-1) when ``breached`` last changed.
    value = models.FloatField(_("value"), null=True, blank=True)
    threshold = models.FloatField(_("threshold"), null=True, blank=True)
    changed_at = models.DateTimeField(_("changed at"), null=True, blank=True)

    class Meta:
        verbose_name = _("queue alert")
        verbose_name_plural = _("queue alerts")
        constraints = [
            models.UniqueConstraint(fields=["queue", "slo"], name="jobguard_queue_alert"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.slo}: {'breached' if self.breached else 'ok'}"
