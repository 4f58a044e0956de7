"""The queue: push, claim, ack, release and fail rows of :class:`QueuedJob`.

What differs between databases (the push, claim and ack statements, NOTIFY and LISTEN) lives
in :mod:`django_jobguard.dialects`; this module asks :func:`dialect_for` and never which
database it is on. Times that decide visibility come from the database clock (``now()``), so
app servers with skewed clocks agree on what is due.

A claimed row gets ``available_at = now + RETRY_AFTER`` (its lease) and the worker's id in
``reserved_by``. Its attempt is counted when it starts: in the claim for the rows the worker
starts at once, by :func:`start` for the rows it claimed ahead. A worker that dies stops
renewing the lease and the row becomes claimable again: a job that had started has used its
attempt, one claimed ahead and never started has not. Every later write checks
``reserved_by`` so that a worker which lost its lease cannot ack or release a job another
worker now holds.
"""

from __future__ import annotations

import datetime
import itertools
import re
import sys
import threading
import time
import uuid
from asyncio import _get_running_loop
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Exists, F, JSONField, Max, Min, OuterRef, Value

from django_jobguard import clock, fair_share, pooling, queue_caps
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.dialects import Listener, ListenUnavailable, NewJob, dialect_for
from django_jobguard.durations import NOW, Due
from django_jobguard.exceptions import class_path, error_text, traceback_text
from django_jobguard.models import FailedJob, PausedQueue, QueuedJob


def push(jobs: Sequence[NewJob], *, using: str | None = None, batch_size: int = 500) -> None:
    """Insert ``jobs`` (one INSERT per batch) and wake the workers listening, if any."""
    using = queue_database(using)
    if not jobs:
        return
    tagged: dict[str, list[uuid.UUID]] = {}
    for job in jobs:
        if job.tags:
            tagged.setdefault(job.tags, []).append(job.id)
    try:
        if not tagged:
            dialect_for(using).push(jobs, batch_size=max(batch_size, 1))
            return
        # Tags (rare, and kept out of the dialects' hot INSERTs) are set by one UPDATE per
        # distinct set, in the INSERT's transaction: no worker sees a row without its tags.
        with transaction.atomic(using=using):
            dialect_for(using).push(jobs, batch_size=max(batch_size, 1))
            for text, ids in tagged.items():
                for start in range(0, len(ids), 500):
                    QueuedJob.objects.using(using).filter(
                        id__in=ids[start:start + 500]).update(tags=text)
    except DatabaseError as exc:
        message = not_migrated(exc, using)
        if message:
            raise type(exc)(message) from None
        raise


#: How each database says a table is missing.
_NO_TABLE = ("does not exist", "no such table", "doesn't exist")


def not_migrated(exc: BaseException, using: str) -> str:
    """A short "run manage.py migrate" message when ``exc`` says one of jobguard's tables is
    missing from ``using``, else ``""``. Only looked at once a statement failed."""
    text = str(exc)
    if "django_jobguard_" not in text or not any(words in text for words in _NO_TABLE):
        return ""
    return (f"jobguard's tables are not in database {using!r}: run `python manage.py "
            f"migrate` (the database said: {text.strip().splitlines()[0]}).")


def unapplied_migrations(using: str | None = None) -> list[str]:
    """The names of jobguard's migrations not applied to ``using`` (two small queries; for
    ``check --database`` and a worker's start, never per job)."""
    import pkgutil

    from django.db.migrations.recorder import MigrationRecorder

    from django_jobguard import migrations

    using = queue_database(using)
    shipped = sorted(m.name for m in pkgutil.iter_modules(migrations.__path__)
                     if m.name[:4].isdigit())
    recorder = MigrationRecorder(connections[using])
    if not recorder.has_table():
        return shipped
    applied = set(recorder.migration_qs.filter(app="django_jobguard").values_list(
        "name", flat=True))
    return [name for name in shipped if name not in applied]


def migrate_message(missing: list[str], using: str) -> str:
    """What to tell someone whose database lacks jobguard's migrations ``missing``."""
    if len(missing) > 3:
        listed = f"{', '.join(missing[:2])}, ... {missing[-1]}"
    else:
        listed = ", ".join(missing)
    return (f"{len(missing)} of jobguard's migrations are not applied to database {using!r} "
            f"({listed}): run `python manage.py migrate`.")


def withdraw(ids: Iterable[Any], *, using: str | None = None) -> None:
    """Delete rows just pushed in the current transaction (a unique job found a duplicate)."""
    using = queue_database(using)
    ids = list(ids)
    if ids:
        QueuedJob.objects.using(using).filter(id__in=ids)._raw_delete(using)


def exists(job_id: Any, *, using: str | None = None) -> bool:
    """Whether a queued row with ``job_id`` exists, counting one that an open transaction is
    inserting: that waits for the transaction to end, as a second insert of the id would.

    This is how a unique lock in a store that cannot roll back (Redis) is judged: its owner's
    row is inserted before the lock is taken, so a lock whose owner has no row was left by a
    rolled-back dispatch (or a process that died) and may be taken over. How the dialect
    waits: an insert of the id in a savepoint, always rolled back (PostgreSQL, SQLite), or a
    locking read (MariaDB/MySQL).
    """
    using = queue_database(using)
    try:
        job_id = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    except ValueError:
        return True  # not a job's lock: never judged as left behind
    return dialect_for(using).job_exists(job_id)


def notify(queues: Iterable[str], *, using: str | None = None) -> None:
    """Wake workers listening on ``queues`` (sent when the surrounding transaction commits;
    a no-op on databases without NOTIFY)."""
    using = queue_database(using)
    dialect_for(using).notify(queues)


def close_broken_connections(*, all_idle: bool = False) -> None:
    """Close this thread's connections that a job or a failed statement left unusable (with
    ``all_idle``: every one, after an error, to start afresh), so the next query reconnects.
    A connection inside a transaction (a test running a worker in-process) is left alone."""
    for conn in (connections.all(initialized_only=True) if all_idle or _get_running_loop()
                 else _wrappers()):  # (on an event loop each task may have its own)
        if conn.in_atomic_block or conn.connection is None:
            continue
        if all_idle or (conn.errors_occurred and not conn.is_usable()):
            conn.close()


def close_claim_connections() -> None:
    """Close this thread's connections of its own for claims (PostgreSQL with prepared
    statements: :class:`~django_jobguard.dialects.postgresql.ClaimConnections`): a thread
    that claimed calls it as it ends."""
    postgresql = sys.modules.get("django_jobguard.dialects.postgresql")
    if postgresql is not None:
        postgresql.close_claim_connections()


_this_thread = threading.local()


def _wrappers() -> list[Any]:
    """This thread's connection wrapper of every database alias (made where missing: that
    opens no connection), kept for the thread (one that runs no event loop: its wrappers
    are the thread's own). A worker's job thread asks after every job,
    and ``connections.all()`` reads asgiref's ``Local`` two or three times per alias: 11 µs
    a call with two aliases, a tenth of a no-op job. Made again if Django replaced its
    storage (its ``_connections``, when the ``DATABASES`` setting changes)."""
    storage = vars(connections).get("_connections")  # (an instance attribute of Django's)
    kept = getattr(_this_thread, "wrappers", None)
    if kept is None or kept[0] is not storage:
        kept = _this_thread.wrappers = (storage, [connections[alias] for alias in connections])
    return kept[1]


def listen(using: str | None = None) -> Listener | None:
    """A listener that wakes on :func:`notify`, or ``None`` where the database has none (the
    worker then polls). It listens on ``JOBGUARD['LISTEN_DATABASE']`` when set; it raises
    :class:`ListenUnavailable` (saying why) when ``using`` is declared behind PgBouncer
    without one, or when a NOTIFY does not reach it (see :mod:`django_jobguard.pooling`)."""
    using = queue_database(using)
    via = pooling.listen_alias(using)
    if via == using and pooling.behind_pgbouncer(using):
        raise ListenUnavailable(
            f"Database {using!r} is behind PgBouncer (JOBGUARD['PGBOUNCER']) and "
            f"JOBGUARD['LISTEN_DATABASE'] is not set: LISTEN needs a session connection "
            f"(docs/databases.md#pgbouncer).")
    return dialect_for(using).listen(via)


# -- claiming ------------------------------------------------------------------------------


def claim(
    queues: Sequence[str],
    *,
    worker_id: str,
    limit: int = 1,
    start: int | None = None,
    named: Sequence[str] | None = None,
    ahead: int = 0,
    using: str | None = None,
) -> list[QueuedJob]:
    """Reserve up to ``limit`` due jobs from the first of ``queues`` that has any
    (:data:`ALL_QUEUES`, ``"*"``, stands for every queue not named in ``named``, by default
    in ``queues``, see :func:`_expand`).

    The first ``start`` of them (default: all) start now and have their attempt counted in
    the claim; the others are claimed ahead (``row.attempt_counted`` is False) and count it
    through :func:`start` when they begin. A payload that does not decode comes back as its
    text, for the worker to fail the job; a poison row comes back with :func:`poison` saying
    why, for the worker to quarantine it.

    ``ahead`` of the ``limit`` rows are a worker's prefetch (no slot waits for them,
    :mod:`django_jobguard.worker.prefetch`): a queue with a concurrency cap or per-key
    limits is not prefetched from (its claimed rows hold places of the limit), so it is
    claimed ``limit - ahead`` rows at most.
    """
    using = queue_database(using)
    lease = float(jobguard_settings.RETRY_AFTER)
    dialect = dialect_for(using)
    for queue in _expand(queues, using, queues if named is None else named):
        cap = queue_caps.global_concurrency(queue)
        fair = fair_share.config(queue)
        if cap is None and (fair is None or fair.per_key is None):
            rows = _claim_from(dialect, queue, worker_id, limit, start, lease, fair)
        elif limit - ahead < 1:
            rows = []  # a prefetch only: nothing from a capped queue
        else:  # counted and claimed while holding the queue's gate row
            with queue_caps.gate(queue, cap, using=using) as room:
                rows = _claim_from(dialect, queue, worker_id, min(limit - ahead, room), start,
                                   lease, fair)
        if rows:
            return rows
    return []


def _claim_from(dialect: Any, queue: str, worker_id: str, limit: int, start: int | None,
                lease: float, fair: fair_share.FairClaim | None = None) -> list[QueuedJob]:
    """:func:`claim` of one queue: the rows started now first, then those claimed ahead (a
    fair queue's in its fair order, :mod:`django_jobguard.fair_share`)."""
    def take(n: int, **options: Any) -> list[QueuedJob]:
        if fair is not None:
            return fair_share.claim(dialect, queue, fair, worker_id=worker_id, limit=n,
                                    lease=lease, **options)
        return dialect.claim(queue, worker_id=worker_id, limit=n, lease=lease, **options)

    now = limit if start is None else max(0, min(start, limit))
    if fair is not None and 0 < now < limit:
        # One fair claim for all of them (its statement costs more to plan than the plain
        # one): every row's attempt counts as it starts, the first ones' too.
        rows = take(limit, count_attempts=False)
        for row in rows:
            row.attempt_counted = bool(poison(row))
        return rows
    rows = take(now) if now else []
    for row in rows:
        row.attempt_counted = True
    if limit > now and len(rows) == now:  # a backlog: claim the rest ahead, uncounted
        ahead = take(limit - now, count_attempts=False)
        for row in ahead:
            # A poison row is not started (the worker quarantines it): nothing to count.
            row.attempt_counted = bool(poison(row))
        rows += ahead
    if rows and fair is None:
        rows.sort(key=lambda r: (not r.attempt_counted, -r.priority))
    elif rows:  # the fair order kept
        rows.sort(key=lambda r: not r.attempt_counted)
    return rows


#: In a worker's queue list: every queue not named in it (``--queue high,*``: ``high`` first).
ALL_QUEUES = "*"
#: What a queue name may look like (what ``--queue a,b`` can name): 1 to 100 characters, no
#: whitespace or commas, and not ``*``. Dispatch, pause and search all hold to it.
QUEUE_NAME = re.compile(r"[^\s,]{1,100}")


def queue_name_problem(name: Any) -> str | None:
    """What is wrong with ``name`` as a queue name, or ``None`` if it is one."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        return (f"{name!r} is not a queue name: 1 to 100 characters, without spaces, line "
                f"breaks or commas (',' separates queues in a worker's list).")
    if name == ALL_QUEUES:
        return f"{name!r} is not a queue name: '*' stands for every queue."
    return None


def _expand(queues: Sequence[str], using: str, named: Sequence[str]) -> Iterator[str]:
    """``queues`` with :data:`ALL_QUEUES` replaced, when a claim reaches it, by the other
    queues that have a due row. Those come in turn, each claim starting one queue further
    on, so that one busy queue does not keep the others waiting."""
    for queue in queues:
        if queue != ALL_QUEUES:
            yield queue
            continue
        others = sorted(set(
            _claimable([ALL_QUEUES], using).filter(available_at__lte=clock.db_now())
            .exclude(queue__in=[q for q in named if q != ALL_QUEUES])
            .values_list("queue", flat=True).distinct().order_by()))
        if others:
            turn = next(_turns) % len(others)
            yield from others[turn:] + others[:turn]


_turns = itertools.count()


def poison(row: QueuedJob) -> str:
    """Why the claimed ``row`` cannot be run (a column the driver cannot load, a counter at
    :data:`~django_jobguard.models.COUNTER_MAX`), or ``""``: a poison row is quarantined,
    failed with that reason, instead of run or retried."""
    return getattr(row, "poison", "")


def claimed_ahead(row: QueuedJob) -> bool:
    """Whether ``row`` was claimed ahead and has not started: its attempt is not counted yet
    (a row not from :func:`claim` counts as started)."""
    return not getattr(row, "attempt_counted", True)


def counted(row: QueuedJob) -> None:
    """``row``'s attempt was just counted (in the database, or in a completion group that
    will write it: :mod:`django_jobguard.worker.completer`): the same on the instance."""
    row.attempts += 1
    row.attempt_counted = True


def start(row: QueuedJob, *, using: str | None = None) -> bool:
    """Count the attempt of a row as it starts, unless its claim already did; False if the
    worker no longer holds it (its lease ran out and another worker took it)."""
    using = queue_database(using)
    if not claimed_ahead(row):
        return True
    if not dialect_for(using).start(row.id, row.reserved_by, row.claims,
                                    relaxed=_relaxed(using, False)):
        return False
    counted(row)
    return True


def start_many(rows: Sequence[QueuedJob], *, using: str | None = None) -> list[QueuedJob]:
    """:func:`start` for several rows claimed ahead, in one statement (rows that start at
    once in free slots); returns those the worker no longer holds (their lease ran out and
    another worker took them: not to be run here), as :func:`start` returns False."""
    using = queue_database(using)
    ahead = [row for row in rows if claimed_ahead(row)]
    if not ahead:
        return []
    started = dialect_for(using).start_many([(row.id, row.claims) for row in ahead],
                                            ahead[0].reserved_by,
                                            relaxed=_relaxed(using, False))
    lost = []
    for row in ahead:
        if row.id in started:
            counted(row)
        else:
            lost.append(row)
    return lost


def paused(queues: Sequence[str] | None = None, *,
           using: str | None = None) -> set[str]:
    """Which of ``queues`` (or of all queues) are paused."""
    using = queue_database(using)
    rows = PausedQueue.objects.using(using)
    if queues is not None:
        rows = rows.filter(queue__in=list(queues))
    return set(rows.values_list("queue", flat=True))


def _claimable(queues: Sequence[str], using: str):
    """Rows of ``queues`` (of every queue when it holds :data:`ALL_QUEUES`) that are not
    paused (what claims may return)."""
    paused_row = PausedQueue.objects.using(using).filter(queue=OuterRef("queue"))
    rows = QueuedJob.objects.using(using).filter(~Exists(paused_row))
    if ALL_QUEUES in queues:
        return rows
    return rows.filter(queue__in=queues)


def next_due(queues: Sequence[str], *, using: str | None = None) -> datetime.datetime | None:
    """When the earliest row of ``queues`` becomes claimable (``None`` if they are empty or
    paused)."""
    using = queue_database(using)
    return _claimable(queues, using).aggregate(due=Min("available_at"))["due"]


def seconds_until_due(queues: Sequence[str], *, using: str | None = None) -> float | None:
    """Seconds until the earliest row of ``queues`` becomes claimable, measured with the
    database clock in the same query (``None`` if the queues are empty or paused)."""
    using = queue_database(using)
    found = _claimable(queues, using).aggregate(
        due=Min("available_at"), now=Max(clock.db_now()))
    if found["due"] is None:
        return None
    return (found["due"] - found["now"]).total_seconds()


def extend_leases(worker_id: str, *, ids: Iterable[Any] | None = None,
                  using: str | None = None) -> int:
    """Push back the lease of the rows ``worker_id`` holds (the worker's heartbeat); only of
    ``ids`` among them when given (the jobs it is still working on).

    Where rows have locks (PostgreSQL, MariaDB/MySQL) the rows another transaction holds are
    skipped, this beat: the worker's own ack of one row and start of the next lock them in
    their order, an UPDATE of all its rows in another, and the two deadlocked (the ack, when
    it lost, left its row leased to run again). A row skipped is being acked, or started and
    renewed at the next beat."""
    using = queue_database(using)
    lease = datetime.timedelta(seconds=float(jobguard_settings.RETRY_AFTER))
    rows = QueuedJob.objects.using(using).filter(reserved_by=worker_id, reserved_at__isnull=False)
    if ids is not None:
        rows = rows.filter(id__in=list(ids))
    if not connections[using].features.has_select_for_update_skip_locked:
        return rows.update(available_at=clock.db_now() + Value(lease))
    renewed = 0
    for attempt in range(RENEW_TRIES):
        if attempt:  # the rows skipped: a job's own write holds them for an instant
            time.sleep(RENEW_RETRY_DELAY)
        with transaction.atomic(using=using):
            free = list(rows.select_for_update(skip_locked=True).values_list("id", flat=True))
            if free:
                renewed += QueuedJob.objects.using(using).filter(id__in=free).update(
                    available_at=clock.db_now() + Value(lease))
        skipped = rows.exclude(id__in=free).values_list("id", flat=True)
        if not skipped.exists():
            break
        rows = rows.filter(id__in=list(skipped))
    return renewed


#: How often :func:`extend_leases` looks again, a moment apart, for the rows it skipped (a row
#: whose lease ran out while the worker was stopped must be renewed at its next beat).
RENEW_TRIES = 3
RENEW_RETRY_DELAY = 0.05


# -- while a job runs ----------------------------------------------------------------------


def cancel_requested(job_id: Any, *, using: str | None = None) -> bool:
    """Whether an operator asked the running job ``job_id`` to stop."""
    using = queue_database(using)
    return QueuedJob.objects.using(using).filter(
        id=job_id, cancel_requested_at__isnull=False).exists()


def request_cancel(job_id: Any, *, using: str | None = None) -> bool:
    """Ask the reserved job ``job_id`` to stop; False if no worker holds it."""
    using = queue_database(using)
    return bool(QueuedJob.objects.using(using).reserved().filter(id=job_id).update(
        cancel_requested_at=clock.db_now()))


def write_progress(job_id: Any, fraction: float, message: str, *, worker_id: str,
                   claims: int | None = None, using: str | None = None) -> bool:
    """Store a running job's progress (only while ``worker_id`` holds it, and with ``claims``
    only under that claim: a run that lost its lease and whose worker claimed the row again
    since, such as a run resuming after a network partition, writes nothing)."""
    using = queue_database(using)
    rows = QueuedJob.objects.using(using).filter(id=job_id, reserved_by=worker_id)
    if claims is not None:
        rows = rows.filter(claims=claims)
    return bool(rows.update(progress=fraction, progress_message=message[:255]))


# -- finishing -----------------------------------------------------------------------------


def _held(row: QueuedJob, using: str):
    """The row as this claim of it holds it: same worker and same claim (``claims``), so a
    late write of an attempt that was ended meanwhile changes nothing."""
    return QueuedJob.objects.using(using).filter(id=row.id, reserved_by=row.reserved_by,
                                                 claims=row.claims)


def _relaxed(using: str, own_transaction: bool) -> bool:
    """Whether an ack may commit without waiting for the disk (``SYNCHRONOUS_ACKS`` off):
    only in a transaction of its own (autocommit, or one the caller opened for the ack and
    its result), never in a caller's transaction that holds other writes."""
    return not jobguard_settings.SYNCHRONOUS_ACKS and (
        own_transaction or not connections[using].in_atomic_block)


def ack(row: QueuedJob, *, then: QueuedJob | None = None, using: str | None = None,
        own_transaction: bool = False) -> bool:
    """Delete a finished job; False if the worker no longer held it (lease lost).

    ``then``, the row claimed ahead that the worker runs next, has its attempt counted in
    the same round trip (see :func:`start`). ``own_transaction``: the caller opened the
    outermost transaction around this ack for the ack's own writes (see ``SYNCHRONOUS_ACKS``)."""
    using = queue_database(using)
    dialect = dialect_for(using)
    relaxed = _relaxed(using, own_transaction)
    if then is None or not claimed_ahead(then):
        return dialect.ack(row.id, row.reserved_by, row.claims, relaxed=relaxed)
    acked, started = dialect.ack_and_start(row.id, row.reserved_by, row.claims, then.id,
                                           then.claims, relaxed=relaxed)
    if started:
        counted(then)
    return acked


def ack_counting(row: QueuedJob, batch_id: str, *, then: QueuedJob | None = None,
                 using: str | None = None) -> tuple[bool, tuple[int, int] | None]:
    """:func:`ack` of a batch member that also counts its success in the batch, atomically
    (one statement on PostgreSQL): ``(acked, (pending, failed) after it)``."""
    using = queue_database(using)
    start = then if then is not None and claimed_ahead(then) else None
    acked, started, counts = dialect_for(using).ack_counting(
        row.id, row.reserved_by, row.claims, start.id if start else None,
        start.claims if start else None, batch_id, relaxed=_relaxed(using, False))
    if started and start is not None:
        counted(start)
    return acked, counts


def release(
    row: QueuedJob,
    *,
    due: Due = NOW,
    count_attempt: bool = True,
    exception: BaseException | None = None,
    count_exception: bool = True,
    wait_reason: str = "",
    using: str | None = None,
) -> bool:
    """Make a reserved job available again when ``due`` (seconds after the database's now,
    or an absolute time).

    ``count_attempt=False`` gives back the attempt the job took (a deferral; a row claimed
    ahead and never started has none to give back).
    ``exception`` (the job's own) is kept as the last error, with its traceback, and counts
    towards ``max_exceptions`` unless ``count_exception=False`` (a middleware handled it).
    ``wait_reason`` says why the job waits, for operators (``circuit 'sms' was open``).
    """
    using = queue_database(using)
    # A debounced row that ran is no longer folded into (its key may wait in a newer row).
    changes: dict[str, Any] = {"reserved_at": None, "reserved_by": "", "available_at": _at(due),
                               "wait_reason": wait_reason[:255], "debounce_key": None}
    if not count_attempt and not claimed_ahead(row):
        changes["attempts"] = F("attempts") - 1
    elif count_attempt and claimed_ahead(row):  # it ran, its start not written (completer)
        changes["attempts"] = F("attempts") + 1
    if exception is not None:
        if count_exception:
            changes["exceptions"] = F("exceptions") + 1
        changes["last_error"] = error_text(exception)
    return bool(_held(row, using).update(**changes))


def _at(due: Due) -> Any:
    """``available_at`` for ``due``: an absolute time as it is, else the database's now plus
    the delay."""
    if due.at is not None:
        return due.at
    now = clock.db_now()
    return now + Value(datetime.timedelta(seconds=due.delay)) if due.delay else now


def fail(
    row: QueuedJob,
    exception: BaseException,
    *,
    reason: str = "",
    last_error: str | None = None,
    using: str | None = None,
) -> FailedJob | None:
    """Move a job to failed jobs with its exception and traceback, in one transaction.

    ``reason`` says which limit ended it; ``last_error`` is the last exception the job itself
    raised (default: the one its row kept from an earlier run).
    """
    using = queue_database(using)
    with transaction.atomic(using=using):
        if not _held(row, using)._raw_delete(using):
            return None
        return FailedJob.objects.using(using).create(
            id=row.id,
            queue=row.queue,
            name=row.name,
            # A JSON null payload is kept as JSON null (None alone would be SQL NULL).
            payload=Value(None, JSONField()) if row.payload is None else row.payload,
            attempts=row.attempts,
            priority=row.priority,
            fair_key=row.fair_key,
            exception_class=class_path(exception),
            message=str(exception)[:10_000],
            traceback=traceback_text(exception),
            reason=reason[:500],
            last_error=row.last_error if last_error is None else last_error,
            tags=getattr(row, "tags", "") or "",
        )


