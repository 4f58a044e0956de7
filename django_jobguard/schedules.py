"""Periodic jobs: ``JOBGUARD["SCHEDULE"]`` and ``@periodic``, enqueued by every worker.

Every ``jobworker`` calls :func:`enqueue_due` from its heartbeat. Each due tick is enqueued
exactly once however many workers run, because enqueuing it means inserting its
:class:`~django_jobguard.models.ScheduleTick` row (unique per schedule and tick) in the same
transaction as the job: the worker that loses the race gets an ``IntegrityError`` and moves on.
Time is the database clock, so workers with skewed clocks agree on what is due.

Missed ticks (no worker ran) follow the schedule's ``catch_up``: ``"none"`` skips them,
``"last"`` (default) runs the newest one once, ``"all"`` runs each (at most
:data:`MAX_CATCH_UP`).

:func:`run_now` (the admin's and the API's "run now") queues one run of a schedule's job at
once, outside the ticks: it records no tick row, so the cron ticks go on exactly as before
(the next one is queued once, at its time).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from django_jobguard import registry
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.cron import CronError, CronExpression, get_zone
from django_jobguard.dialects import dialect_for
from django_jobguard.models import ScheduleTick

__all__ = ["CATCH_UP", "MAX_CATCH_UP", "RUN_NOW_TAG", "Schedule", "ScheduleError",
           "ScheduleStatus", "UnknownScheduleError", "all_schedules", "enqueue_due", "periodic",
           "problems", "prune_ticks", "run_now", "schedule_status"]

logger = logging.getLogger("django_jobguard.schedules")

CATCH_UP = ("none", "last", "all")
#: At most this many missed ticks are enqueued per schedule with ``catch_up="all"``.
MAX_CATCH_UP = 1000
#: A schedule seen for the first time runs a tick that fell due this recently.
FIRST_LOOK_BACK = datetime.timedelta(seconds=60)
#: Tick rows older than this are pruned (the newest of each schedule is always kept).
KEEP_TICKS = datetime.timedelta(days=30)

_KEYS = {"job", "cron", "args", "kwargs", "timezone", "catch_up", "queue", "enabled"}


class ScheduleError(ValueError):
    """A schedule that cannot run; ``check_id`` is the system check that reports it."""

    def __init__(self, message: str, check_id: str) -> None:
        super().__init__(message)
        self.check_id = check_id


@dataclass(frozen=True)
class Schedule:
    """One periodic job: run ``job`` with ``args``/``kwargs`` whenever ``cron`` fires in
    ``timezone``."""

    name: str
    job: str
    cron: CronExpression
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    timezone: str = "UTC"
    catch_up: str = "last"
    queue: str | None = None
    enabled: bool = True

    @classmethod
    def build(cls, name: str, *, job: str, cron: str, args: Sequence[Any] = (),
              kwargs: Mapping[str, Any] | None = None, timezone: str = "UTC",
              catch_up: str = "last", queue: str | None = None,
              enabled: bool = True) -> Schedule:
        """Validate and build; :class:`ScheduleError` names the problem."""
        where = f"schedule {name!r}"
        try:
            expression = CronExpression.parse(cron)
        except CronError as exc:
            raise ScheduleError(f"{where}: bad cron expression: {exc}.", "jobguard.E060") from None
        if not isinstance(job, str) or not job:
            raise ScheduleError(f"{where}: 'job' must be a registered job name.",
                                "jobguard.E064")
        try:
            get_zone(timezone)
        except CronError as exc:
            raise ScheduleError(f"{where}: {exc}.", "jobguard.E062") from None
        if catch_up not in CATCH_UP:
            raise ScheduleError(f"{where}: catch_up must be one of {', '.join(CATCH_UP)}, "
                                f"not {catch_up!r}.", "jobguard.E063")
        if not isinstance(args, list | tuple) or not isinstance(kwargs or {}, Mapping):
            raise ScheduleError(f"{where}: 'args' must be a list and 'kwargs' a dict.",
                                "jobguard.E064")
        try:
            json.dumps([list(args), dict(kwargs or {})])
        except (TypeError, ValueError) as exc:
            raise ScheduleError(f"{where}: arguments must be JSON values ({exc}).",
                                "jobguard.E064") from None
        if queue is not None and not isinstance(queue, str):
            raise ScheduleError(f"{where}: 'queue' must be a string.", "jobguard.E064")
        return cls(name=name, job=job, cron=expression, args=tuple(args),
                   kwargs=dict(kwargs or {}), timezone=timezone, catch_up=catch_up,
                   queue=queue, enabled=bool(enabled))

    def job_class(self) -> type:
        """The registered job class (``ScheduleError`` E061 when nothing is registered)."""
        try:
            return registry.get(self.job)
        except registry.UnknownJobError as exc:
            raise ScheduleError(f"schedule {self.name!r}: {exc}", "jobguard.E061") from None

    def due_ticks(self, last: datetime.datetime | None,
                  now: datetime.datetime) -> tuple[list[datetime.datetime], bool]:
        """The ticks to enqueue now after the newest recorded tick ``last``, and whether
        they are only recorded as missed (``catch_up="none"`` after a gap)."""
        start = last if last is not None else now - FIRST_LOOK_BACK
        if self.catch_up == "all":
            return self.cron.between(start, now, self.timezone, limit=MAX_CATCH_UP), False
        ticks = self.cron.between(start, now, self.timezone, limit=1)
        if self.catch_up == "none" and ticks and now - ticks[-1] > FIRST_LOOK_BACK:
            return ticks, True
        return ticks, False

    def next_tick(self, after: datetime.datetime) -> datetime.datetime | None:
        return self.cron.next_after(after, self.timezone)


# -- declaring schedules ------------------------------------------------------------------

_declared: dict[str, Schedule] = {}


def periodic(cron: str, *, name: str | None = None, args: Sequence[Any] = (),
             kwargs: Mapping[str, Any] | None = None, timezone: str = "UTC",
             catch_up: str = "last", queue: str | None = None) -> Callable[[Any], Any]:
    """Run a job on a cron schedule: on a ``Job`` subclass, or above ``@job``::

        @periodic("*/5 * * * *")
        @job
        def refresh_rates(): ...

    The schedule is named after the job unless ``name`` is given.
    """
    def decorate(target: Any) -> Any:
        job_name = getattr(target, "name", None)
        if not isinstance(job_name, str) or not (
                isinstance(target, type) or hasattr(target, "job_class")):
            raise TypeError("@periodic goes on a Job subclass or above @job, not on "
                            f"{target!r}.")
        schedule = Schedule.build(name or job_name, job=job_name, cron=cron, args=args,
                                  kwargs=kwargs, timezone=timezone, catch_up=catch_up,
                                  queue=queue)
        _declared[schedule.name] = schedule
        return target

    return decorate


def forget_declared(name: str) -> None:
    """Drop a schedule declared with ``@periodic`` (tests that declare them on the fly)."""
    _declared.pop(name, None)


def _from_settings() -> tuple[dict[str, Schedule], list[ScheduleError]]:
    found: dict[str, Schedule] = {}
    errors: list[ScheduleError] = []
    raw = jobguard_settings.SCHEDULE
    if not isinstance(raw, Mapping):
        return found, [ScheduleError("JOBGUARD['SCHEDULE'] must be a dict of name → entry.",
                                     "jobguard.E064")]
    for name, entry in raw.items():
        if not isinstance(entry, Mapping) or "job" not in entry or "cron" not in entry:
            errors.append(ScheduleError(
                f"schedule {name!r}: an entry is a dict with at least 'job' and 'cron'.",
                "jobguard.E064"))
            continue
        unknown = set(entry) - _KEYS
        if unknown:
            errors.append(ScheduleError(
                f"schedule {name!r}: unknown key(s) {sorted(unknown)}; known: "
                f"{sorted(_KEYS)}.", "jobguard.E064"))
            continue
        try:
            found[name] = Schedule.build(str(name), **entry)
        except ScheduleError as exc:
            errors.append(exc)
    return found, errors


def all_schedules() -> dict[str, Schedule]:
    """Every valid schedule by name: ``@periodic`` ones, then ``JOBGUARD["SCHEDULE"]`` (which
    wins on a name clash). Invalid entries are left out (the system checks report them)."""
    return {**_declared, **_from_settings()[0]}


def problems() -> list[tuple[str, str]]:
    """``(check id, message)`` for every schedule that cannot run (for ``checks/settings.py``)."""
    found, errors = _from_settings()
    result = [(exc.check_id, str(exc)) for exc in errors]
    for name in sorted(set(found) & set(_declared)):
        result.append(("jobguard.W050", f"schedule {name!r} is declared with @periodic and in "
                                        f"JOBGUARD['SCHEDULE']; the setting wins."))
    for schedule in {**_declared, **found}.values():
        try:
            schedule.job_class()
        except ScheduleError as exc:
            result.append((exc.check_id, str(exc)))
        if schedule.enabled and schedule.next_tick(
                datetime.datetime.now(datetime.UTC)) is None:
            result.append(("jobguard.W051", f"schedule {schedule.name!r}: cron "
                                            f"{schedule.cron.text!r} never fires (no such "
                                            f"date, e.g. 30 February); the job never runs."))
    return result


# -- enqueuing --------------------------------------------------------------------------

def _last_ticks(names: Sequence[str], using: str) -> dict[str, datetime.datetime]:
    rows = (ScheduleTick.objects.using(using).filter(schedule__in=names)
            .values("schedule").annotate(last=Max("tick")).order_by())
    return {row["schedule"]: row["last"] for row in rows}


def _enqueue_tick(schedule: Schedule, tick: datetime.datetime, *, missed: bool,
                  using: str) -> bool:
    """Record ``tick`` and queue its job in one transaction; ``False`` if another worker
    recorded it first."""
    from django_jobguard.jobs import dispatch

    try:
        with transaction.atomic(using=using):
            row = ScheduleTick.objects.using(using).create(
                schedule=schedule.name, tick=tick, skipped="missed" if missed else "")
            if missed:
                return True
            job_class = schedule.job_class()
            result = dispatch(job_class(*schedule.args, **schedule.kwargs),
                              queue=schedule.queue, using=using)
            row.job_id = result.id or ""
            row.skipped = result.skipped or ""
            row.save(update_fields=["job_id", "skipped"])
    except IntegrityError:
        return False
    return True


def _forget_impossible_ticks(schedule: Schedule, last: datetime.datetime,
                             now: datetime.datetime, using: str) -> datetime.datetime | None:
    """The newest tick of ``schedule`` to go on from, when the recorded one, ``last``, is
    later than ``now``. Ticks are recorded only once due, so a tick even beyond the next fire
    after ``now`` is a corrupt row (edited by hand, restored from elsewhere, a clock that was
    years ahead): it would stop the schedule until that date. Such rows are deleted with a
    warning. A tick no later than the next fire is kept (the clock stepped back a little)."""
    limit = schedule.next_tick(now)
    if limit is None or last <= limit:
        return last
    rows = ScheduleTick.objects.using(using).filter(schedule=schedule.name)
    deleted = rows.filter(tick__gt=limit).delete()[0]
    logger.warning("Schedule %r had %d tick(s) recorded after its next fire (%s), the newest "
                   "at %s: corrupt rows, deleted so the schedule keeps firing.",
                   schedule.name, deleted, limit.isoformat(), last.isoformat())
    return rows.aggregate(last=Max("tick"))["last"]


def enqueue_due(*, using: str | None = None,
                now: datetime.datetime | None = None) -> int:
    """Queue every due tick of every enabled schedule once; returns how many this call
    recorded. A broken schedule is logged and skipped; the others still run."""
    using = queue_database(using)
    schedules = [s for s in all_schedules().values() if s.enabled]
    if not schedules:
        return 0
    now = now or dialect_for(using).now()
    last = _last_ticks([s.name for s in schedules], using)
    recorded = 0
    for schedule in schedules:
        try:
            previous = last.get(schedule.name)
            if previous is not None and previous > now:
                previous = _forget_impossible_ticks(schedule, previous, now, using)
            ticks, missed = schedule.due_ticks(previous, now)
            for tick in ticks[-1:] if missed else ticks:
                recorded += _enqueue_tick(schedule, tick, missed=missed, using=using)
        except (ScheduleError, TypeError, ValueError) as exc:
            logger.error("Schedule %r was not enqueued: %s", schedule.name, exc)
    return recorded


class UnknownScheduleError(LookupError):
    """No valid schedule has the name."""


#: The tag of a job queued by :func:`run_now` (with ``schedule:<name>`` when the schedule's
#: name is a valid tag).
RUN_NOW_TAG = "run-now"


def run_now(name: str, *, actor: str = "", using: str | None = None) -> Any:
    """Queue one run of schedule ``name``'s job now, with its arguments and queue, and return
    the :class:`~django_jobguard.jobs.Dispatched` (falsy, ``skipped="unique"``, when a unique
    job's copy is queued). A disabled schedule may be run too.

    No :class:`~django_jobguard.models.ScheduleTick` is written: the ticks are cron instants
    recorded once each, and the newest recorded one is where the next tick is counted from, so
    a manual run that wrote one (at a cron instant, or after a gap) could take a tick's place
    or hide missed ones. The job carries the tags ``run-now`` and ``schedule:<name>``.
    :class:`UnknownScheduleError` for a name no valid schedule has; :class:`ScheduleError`
    (E061) when its job is not registered."""
    from django_jobguard import tags
    from django_jobguard.jobs import dispatch
    from django_jobguard.operations import audit

    using = queue_database(using)
    schedule = all_schedules().get(name)
    if schedule is None:
        raise UnknownScheduleError(f"No schedule {name!r}: declare it in "
                                   f"JOBGUARD['SCHEDULE'] or with @periodic.")
    job_class = schedule.job_class()
    marks = [RUN_NOW_TAG]
    try:
        marks += list(tags.validate([f"schedule:{name}"], owner=name))
    except (TypeError, ValueError):
        pass  # a name that is no tag (spaces, too long): "run-now" alone
    result = dispatch(job_class(*schedule.args, **schedule.kwargs), queue=schedule.queue,
                      using=using, tags=marks)
    audit.record("schedule_run_now", 1 if result else 0,
                 f"Ran schedule {name!r} now (job {result.id})" if result else
                 f"Ran schedule {name!r} now: skipped, {result.skipped}", actor)
    return result


def prune_ticks(*, older_than: datetime.timedelta = KEEP_TICKS,
                using: str | None = None) -> int:
    """Delete tick rows older than ``older_than``, keeping each schedule's newest."""
    using = queue_database(using)
    cutoff = dialect_for(using).now() - older_than
    deleted = 0
    ticks = ScheduleTick.objects.using(using)
    for name, last in _last_ticks(list(ticks.values_list("schedule", flat=True).distinct()),
                                  using).items():
        deleted += ticks.filter(schedule=name, tick__lt=min(cutoff, last)).delete()[0]
    return deleted


class Ticker:
    """What a worker's heartbeat calls: :func:`enqueue_due` each beat, pruning hourly."""

    def __init__(self, using: str | None = None) -> None:
        self.using = queue_database(using)
        self._pruned = time.monotonic()

    def __call__(self) -> int:
        count = enqueue_due(using=self.using)
        if time.monotonic() - self._pruned > 3600:
            self._pruned = time.monotonic()
            prune_ticks(using=self.using)
        return count

    def run_once(self) -> int:
        """:meth:`__call__`, logging a failure instead of raising (the worker keeps going)."""
        try:
            return self()
        except Exception as exc:
            logger.warning("Enqueuing periodic jobs failed (%s); retrying next beat.", exc)
            return 0


# -- reporting --------------------------------------------------------------------------

@dataclass(frozen=True)
class ScheduleStatus:
    """A schedule with its last recorded tick and its next one (for commands, admin, API)."""

    name: str
    job: str
    cron: str
    timezone: str
    catch_up: str
    enabled: bool
    last_tick: datetime.datetime | None
    last_job_id: str
    last_skipped: str
    next_tick: datetime.datetime | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601 (UTC), ``None`` when there is none."""
        return {"name": self.name, "job": self.job, "cron": self.cron,
                "timezone": self.timezone, "catch_up": self.catch_up, "enabled": self.enabled,
                "last_tick": self.last_tick.isoformat() if self.last_tick else None,
                "last_job_id": self.last_job_id, "last_skipped": self.last_skipped,
                "next_tick": self.next_tick.isoformat() if self.next_tick else None}


def schedule_status(*, using: str | None = None) -> list[ScheduleStatus]:
    """Every valid schedule, by name, with its last and next run."""
    using = queue_database(using)
    schedules = all_schedules()
    now = dialect_for(using).now()
    lasts = _last_ticks(list(schedules), using)
    last = {row.schedule: row for row in ScheduleTick.objects.using(using).filter(
        schedule__in=list(lasts), tick__in=list(lasts.values()))
        if row.tick == lasts[row.schedule]}
    result = []
    for name in sorted(schedules):
        s = schedules[name]
        row = last.get(name)
        result.append(ScheduleStatus(
            name=name, job=s.job, cron=s.cron.text, timezone=s.timezone, catch_up=s.catch_up,
            enabled=s.enabled, last_tick=row.tick if row else None,
            last_job_id=row.job_id if row else "", last_skipped=row.skipped if row else "",
            next_tick=s.next_tick(now) if s.enabled else None))
    return result
