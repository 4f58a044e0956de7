"""The ORM path: MySQL 8 / MariaDB, and any other backend Django supports.

Claims lock their candidates with ``SELECT … FOR UPDATE SKIP LOCKED`` (plain FOR UPDATE
where the backend lacks SKIP LOCKED) and lease them in the same transaction. A lock is taken
with a conditional UPDATE, then an INSERT that the unique index on ``key`` makes atomic.
Times come from the database clock through Django's ``Now()``.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import (
    BigIntegerField,
    Case,
    Exists,
    F,
    Func,
    PositiveIntegerField,
    Q,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Greatest
from django.db.models.sql import Query

from django_jobguard import clock
from django_jobguard.dialects.base import (
    STATISTIC_KEY,
    STATISTIC_MERGED,
    Dialect,
    ThrottleRow,
    claimed_rows,
    clock_value,
    fair_ranking,
)
from django_jobguard.fair_share import FairClaim
from django_jobguard.models import COUNTER_MAX, Lock, PausedQueue, QueuedJob, Throttle

if TYPE_CHECKING:
    from django_jobguard.dialects.base import NewJob

_THROTTLE_COLUMNS = ("key", "data", "value", "state")


class _NowMicros(Func):
    """The database clock in microseconds (the fencing-token floor); without SQL for it, the
    best there is: this process's clock."""

    output_field = BigIntegerField()

    def __init__(self, sql: str | None) -> None:
        super().__init__()
        self.sql = sql

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list]:
        if self.sql is None:
            return "%s", [time.time_ns() // 1000 + round(clock.offset() * 1_000_000)]
        return self.sql, []


def _saturating(counter: str, add: int) -> Case:
    """``counter + add``, but never past :data:`COUNTER_MAX` (a row there is quarantined, see
    :func:`~django_jobguard.dialects.base.job_from_values`): no "out of range" error."""
    return Case(When(**{f"{counter}__lt": COUNTER_MAX}, then=F(counter) + add),
                default=F(counter), output_field=PositiveIntegerField())


def _expiry(ttl: float | None) -> Any:
    return clock.db_now() + Value(datetime.timedelta(seconds=ttl)) if ttl else None


class GenericDialect(Dialect):
    """Any backend, through the ORM."""

    #: The database clock as a UTC timestamp (``None``: Django's ``Now()``).
    NOW: str | None = None
    #: The database clock in microseconds since the epoch (``None``: this process's clock).
    NOW_US: str | None = None

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self._claimed_sql: dict[int, str] = {}
        shift = clock.offset()
        if shift and self.NOW is not None:  # a test clock (django_jobguard.clock)
            self.NOW = f"({self.NOW} + INTERVAL {round(shift * 1_000_000)} MICROSECOND)"
        if shift and self.NOW_US is not None:
            self.NOW_US = f"({self.NOW_US} + {round(shift * 1_000_000)})"

    # -- the dashboard ---------------------------------------------------------------------

    def add_queue_counts(self, minute: datetime.datetime,
                         counts: Sequence[tuple[str, int, int]]) -> None:
        """Add to each row with an UPDATE (``done = done + n``, atomic on any database),
        inserting it when it is missing; an insert that lost the race to another worker's
        adds to the row that one made."""
        from django_jobguard.models import QueueMinute

        rows = QueueMinute.objects.using(self.using)
        with transaction.atomic(using=self.using):
            for queue, done, failed in counts:
                this = rows.filter(minute=minute, queue=queue)
                if this.update(done=F("done") + done, failed=F("failed") + failed):
                    continue
                try:
                    with transaction.atomic(using=self.using):
                        rows.create(minute=minute, queue=queue, done=done, failed=failed)
                except IntegrityError:
                    this.update(done=F("done") + done, failed=F("failed") + failed)

    def add_run_statistics(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Add to each row with an UPDATE (counts added, smallest and largest kept: atomic on
        any database), inserting it when it is missing; an insert that lost the race to
        another worker's adds to the row that one made."""
        from django_jobguard.models import STATISTIC_COLUMNS, RunStatistic

        table = RunStatistic.objects.using(self.using)
        with transaction.atomic(using=self.using):
            for row in rows:
                values = dict(zip(STATISTIC_COLUMNS, row, strict=True))
                this = table.filter(**{k: values[k] for k in STATISTIC_KEY})
                changes: dict[str, Any] = {k: F(k) + values[k] for k in (
                    "runs", "failures", "runtimes", "waits")}
                for column in ("runtime_min", "runtime_max", "wait_min", "wait_max"):
                    if values[column] is not None:
                        beyond = (Q(**{f"{column}__gt": values[column]})
                                  if column.endswith("_min")
                                  else Q(**{f"{column}__lt": values[column]}))
                        changes[column] = Case(
                            When(Q(**{f"{column}__isnull": True}) | beyond,
                                 then=Value(values[column])), default=F(column))
                if this.update(**changes):
                    continue
                try:
                    with transaction.atomic(using=self.using):
                        table.create(**values)
                except IntegrityError:
                    this.update(**changes)

    def queue_names(self) -> list[str]:
        """``SELECT DISTINCT queue`` (MySQL and MariaDB read it from the claim index with a
        loose index scan, one descent per queue)."""
        return list(QueuedJob.objects.using(self.using).order_by("queue")
                    .values_list("queue", flat=True).distinct())

    # -- clock -----------------------------------------------------------------------------

    def now(self) -> datetime.datetime:
        connection = connections[self.using]
        if self.NOW is None:
            sql, params = Query(None).get_compiler(connection=connection).compile(
                clock.db_now())
        else:
            sql, params = self.NOW, []
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}{connection.features.bare_select_suffix}", params)
            value = cursor.fetchone()[0]
        return clock_value(value)

    # -- queue -----------------------------------------------------------------------------

    def push(self, jobs: Sequence[NewJob], *, batch_size: int) -> None:
        rows = [self._row(job) for job in jobs]
        if len(rows) == 1:
            rows[0].save(force_insert=True, using=self.using)
        else:
            QueuedJob.objects.using(self.using).bulk_create(rows, batch_size=batch_size)

    @staticmethod
    def _row(job: NewJob) -> QueuedJob:
        # The payload goes in as the text it is (a text parameter, which JSON columns take),
        # not through the JSON field's encoder.
        row = QueuedJob(id=job.id, name=job.name, queue=job.queue, priority=job.priority,
                        payload=Value(job.payload, output_field=TextField()),
                        fair_key=job.fair_key)
        if job.at is not None:
            row.available_at = job.at
        elif job.delay or clock.offset():
            row.available_at = clock.db_now() + Value(datetime.timedelta(
                seconds=job.delay or 0))
        return row

    def claim(self, queue: str, *, worker_id: str, limit: int, lease: float,
              count_attempts: bool = True, fair: FairClaim | None = None) -> list[QueuedJob]:
        jobs = QueuedJob.objects.using(self.using)
        with transaction.atomic(using=self.using):
            if fair is not None:
                ids = self._fair_ids(queue, fair, limit)
            else:
                paused = PausedQueue.objects.using(self.using).filter(queue=queue)
                candidates = jobs.filter(~Exists(paused), queue=queue,
                                         available_at__lte=clock.db_now()).order_by(
                    "-priority", "available_at")
                ids = list(self._locking(candidates).values_list("id", flat=True)[:limit])
            if not ids:
                return []
            jobs.filter(id__in=ids).update(
                attempts=_saturating("attempts", int(count_attempts)),
                reserved_at=clock.db_now(),
                reserved_by=worker_id,
                claims=_saturating("claims", 1),
                available_at=clock.db_now() + Value(datetime.timedelta(seconds=lease)),
            )
            # Read back in SQL, the payload as text: the JSON field's decoder would raise out
            # of the claim on a payload it cannot decode.
            connection = connections[self.using]
            prep = QueuedJob._meta.pk.get_db_prep_value
            with connection.cursor() as cursor:
                cursor.execute(self._claimed_statement(len(ids)),
                               [*(prep(i, connection) for i in ids), worker_id])
                rows = claimed_rows(self.using, cursor.fetchall())
        if fair is not None:  # in the fair order
            place = {job_id: index for index, job_id in enumerate(ids)}
            rows.sort(key=lambda row: place.get(row.id, len(place)))
        return rows

    def _locking(self, rows: Any) -> Any:
        """``rows`` locked until the transaction ends, skipping rows another claim locked."""
        if connections[self.using].features.has_select_for_update_skip_locked:
            return rows.select_for_update(skip_locked=True)
        return rows.select_for_update()

    def _fair_ids(self, queue: str, fair: FairClaim, limit: int) -> list[Any]:
        """The ids of up to ``limit`` due rows of ``queue`` in the fair order, locked: the
        window function ranks twice as many (MariaDB/MySQL lock no rows of a query with
        one), which are then locked skipping those another claim holds (re-checked as due:
        a locking read sees the latest committed rows), the first ``limit`` kept in order."""
        connection = connections[self.using]
        sql, params = fair_ranking(connection, queue, fair, limit * 2,
                                   now=self.NOW or "CURRENT_TIMESTAMP",
                                   div="DIV" if connection.vendor == "mysql" else "/")
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            ranked = [QueuedJob._meta.pk.to_python(value) for (value,) in cursor.fetchall()]
        if not ranked:
            return []
        jobs = QueuedJob.objects.using(self.using)
        locked = set(self._locking(jobs.filter(
            id__in=ranked, queue=queue, available_at__lte=clock.db_now())).values_list(
            "id", flat=True))
        return [job_id for job_id in ranked if job_id in locked][:limit]

    def _claimed_statement(self, count: int) -> str:
        sql = self._claimed_sql.get(count)
        if sql is None:
            quote, meta = connections[self.using].ops.quote_name, QueuedJob._meta
            columns = ", ".join(quote(f.column) for f in meta.concrete_fields)
            sql = (f"SELECT {columns} FROM {quote(meta.db_table)} WHERE {quote(meta.pk.column)} "
                   f"IN ({', '.join(['%s'] * count)}) "
                   f"AND {quote(meta.get_field('reserved_by').column)} = %s")
            self._claimed_sql[count] = sql
        return sql

    def ack(self, job_id: Any, reserved_by: str, claims: int, *, relaxed: bool = False) -> bool:
        held = QueuedJob.objects.using(self.using).filter(id=job_id, reserved_by=reserved_by,
                                                          claims=claims)
        return bool(held._raw_delete(self.using))

    # -- locks -----------------------------------------------------------------------------

    def acquire_lock(self, key: str, owner: str, *, ttl: float | None,
                     job_id: str) -> int | None:
        locks = Lock.objects.using(self.using)
        with transaction.atomic(using=self.using):
            taken = locks.filter(Q(owner="") | Q(expires_at__lte=clock.db_now()),
                                 key=key).update(
                owner=owner, token=Greatest(F("token") + 1, _NowMicros(self.NOW_US)),
                acquired_at=clock.db_now(), expires_at=_expiry(ttl), job_id=job_id,
            )
            if not taken:
                try:
                    with transaction.atomic(using=self.using):
                        locks.create(key=key, owner=owner, token=_NowMicros(self.NOW_US),
                                     acquired_at=clock.db_now(), expires_at=_expiry(ttl),
                                     job_id=job_id)
                except IntegrityError:
                    return None
            return locks.filter(key=key, owner=owner).values_list("token", flat=True).get()

    def release_lock(self, key: str, owner: str) -> bool:
        return bool(Lock.objects.using(self.using).filter(key=key, owner=owner).update(
            owner="", expires_at=None))

    # -- throttle rows ---------------------------------------------------------------------

    def lock_throttles(self, keys: Sequence[str], kind: str) -> dict[str, ThrottleRow]:
        throttles = Throttle.objects.using(self.using)

        def lock() -> dict[str, ThrottleRow]:
            rows = throttles.select_for_update().filter(key__in=keys).order_by("key")
            return {r[0]: ThrottleRow(*r) for r in rows.values_list(*_THROTTLE_COLUMNS)}

        rows = lock()
        if len(rows) == len(keys):
            return rows
        throttles.bulk_create([Throttle(key=key, kind=kind) for key in keys],
                              ignore_conflicts=True)
        return lock()

    def peek_throttle(self, key: str) -> ThrottleRow | None:
        found = Throttle.objects.using(self.using).filter(key=key).values_list(
            *_THROTTLE_COLUMNS).first()
        return ThrottleRow(*found) if found else None

    def write_throttle(self, key: str, *, kind: str, hits: int, limit: int, state: str,
                       value: float, data: str, resets_at: datetime.datetime | None,
                       expires_at: datetime.datetime) -> None:
        Throttle.objects.using(self.using).filter(key=key).update(
            kind=kind, hits=hits, limit=limit, state=state, value=value, data=data,
            resets_at=resets_at, expires_at=expires_at, updated_at=clock.db_now())


# The columns a push writes, and one row of them: Django's ``Now() + delay`` on MySQL.
_PUSH_COLUMNS = ("id", "queue", "name", "payload", "attempts", "exceptions", "priority",
                 "available_at", "reserved_by", "last_error", "fair_key")
_MYSQL_PUSH_ROW = ("(%s, %s, %s, %s, 0, 0, %s,"
                   " COALESCE(%s, CURRENT_TIMESTAMP(6) + INTERVAL %s MICROSECOND), '', '', %s)")


class MySQLDialect(GenericDialect):
    """MySQL 8 / MariaDB 10.6+: the ORM path, with the clock read in SQL and the push as one
    raw multi-row INSERT (it runs for every dispatch)."""

    NOW = "UTC_TIMESTAMP(6)"
    NOW_US = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"

    def add_queue_counts(self, minute: datetime.datetime,
                         counts: Sequence[tuple[str, int, int]]) -> None:
        """One ``INSERT … ON DUPLICATE KEY UPDATE done = done + VALUES(done)``."""
        self._insert_queue_counts(minute, counts, lambda q, table: (
            f"ON DUPLICATE KEY UPDATE {q('done')} = {q('done')} + VALUES({q('done')}), "
            f"{q('failed')} = {q('failed')} + VALUES({q('failed')})"))

    def add_run_statistics(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """One ``INSERT … ON DUPLICATE KEY UPDATE runs = runs + VALUES(runs)``."""
        self._insert_run_statistics(rows, lambda q, table, _merge: (
            "ON DUPLICATE KEY UPDATE " + ", ".join(
                self._merge_sql(c, q) for c in STATISTIC_MERGED)))

    @staticmethod
    def _merge_sql(column: str, q: Any) -> str:
        new = f"VALUES({q(column)})"
        if column in ("runs", "failures", "runtimes", "waits"):
            return f"{q(column)} = {q(column)} + {new}"
        better = "<" if column.endswith("_min") else ">"
        return (f"{q(column)} = CASE WHEN {q(column)} IS NULL OR {new} {better} {q(column)} "
                f"THEN {new} ELSE {q(column)} END")

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self._push_sql: dict[int, str] = {}

    def job_exists(self, job_id: uuid.UUID) -> bool:
        """A locking read: InnoDB makes it wait for a transaction that inserted the row and
        then sees the committed row. (The insert probe would take next-key locks on the
        duplicate key, and two dispatches probing each other's rows could deadlock.)"""
        connection = connections[self.using]
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {quote(QueuedJob._meta.db_table)} WHERE "
                           f"{quote(QueuedJob._meta.pk.column)} = %s LOCK IN SHARE MODE",
                           [QueuedJob._meta.pk.get_db_prep_value(job_id, connection)])
            return cursor.fetchone() is not None

    def acquire_lock(self, key: str, owner: str, *, ttl: float | None,
                     job_id: str) -> int | None:
        """Take the key's row with the generic conditional UPDATE, after making sure the row
        exists, committed, outside the caller's transaction.

        An INSERT of the row inside the caller's transaction deadlocked on InnoDB when that
        transaction rolled back (error 1213): the other transactions waiting to insert the
        same key inherit gap locks on the removed row's place, each holds one and each needs
        the insert intention lock the other's gap lock blocks. A row that is already there is
        never removed by a rollback, and the UPDATEs queue up on its row lock instead. The
        free row (owner empty) is created by :meth:`_create_lock_row`; cleaning removes it
        after an hour like any released lock's row, and a row removed in between is made
        again."""
        locks = Lock.objects.using(self.using)
        for _ in range(3):
            if not locks.filter(key=key).exists() and not self._create_lock_row(key):
                return super().acquire_lock(key, owner, ttl=ttl, job_id=job_id)
            with transaction.atomic(using=self.using):
                taken = locks.filter(Q(owner="") | Q(expires_at__lte=clock.db_now()),
                                     key=key).update(
                    owner=owner, token=Greatest(F("token") + 1, _NowMicros(self.NOW_US)),
                    acquired_at=clock.db_now(), expires_at=_expiry(ttl), job_id=job_id,
                )
                if taken:
                    return locks.filter(key=key, owner=owner).values_list(
                        "token", flat=True).get()
            if locks.filter(key=key).exists():
                return None  # held by another owner
        return None

    def _create_lock_row(self, key: str) -> bool:
        """Insert the free row of ``key`` (if missing) and commit it: on this connection when
        it is outside a transaction, else on a second connection of this thread; ``False``
        when that cannot be done without waiting on the caller's own transaction.

        The second connection waits at most a second for a row lock: longer means it waits for
        the caller's transaction (which deleted the row, say), which would wait for it in turn.
        The caller then inserts the row itself, as the generic dialect does. A deadlock of the
        one-statement insert with another of the same key is retried."""
        connection = connections[self.using]
        side = _side_connection(self.using) if connection.in_atomic_block else connection
        quote, meta = connection.ops.quote_name, Lock._meta
        columns = ", ".join(quote(meta.get_field(name).column) for name in (
            "key", "owner", "token", "acquired_at", "expires_at", "job_id"))
        sql = (f"INSERT IGNORE INTO {quote(meta.db_table)} ({columns}) "
               f"VALUES (%s, '', 0, {self.NOW}, NULL, '')")
        for attempt in range(1, 5):
            try:
                with side.cursor() as cursor:
                    if side is not connection:
                        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
                    cursor.execute(sql, [key])
                return True
            except (OperationalError, InterfaceError) as exc:
                code = exc.args[0] if exc.args else None
                if code == _LOCK_WAIT_TIMEOUT:
                    return False
                if side is not connection:  # gone away, or a deadlock: a fresh one next
                    side.close()
                if attempt == 4:
                    raise
                time.sleep(0.005 * attempt)
        return False

    def push(self, jobs: Sequence[NewJob], *, batch_size: int) -> None:
        connection = connections[self.using]
        prep_id = QueuedJob._meta.pk.get_db_prep_value
        adapt = connection.ops.adapt_datetimefield_value
        with connection.cursor() as cursor:
            for start in range(0, len(jobs), batch_size):
                batch = jobs[start:start + batch_size]
                params: list[Any] = []
                for job in batch:
                    params += [prep_id(job.id, connection), job.queue, job.name, job.payload,
                               job.priority, adapt(job.at),
                               round(((job.delay or 0) + clock.offset()) * 1_000_000),
                               job.fair_key]
                cursor.execute(self._push_statement(len(batch)), params)

    def _push_statement(self, rows: int) -> str:
        sql = self._push_sql.get(rows)
        if sql is None:
            quote = connections[self.using].ops.quote_name
            sql = (f"INSERT INTO {quote(QueuedJob._meta.db_table)} "
                   f"({', '.join(map(quote, _PUSH_COLUMNS))}) "
                   f"VALUES {', '.join([_MYSQL_PUSH_ROW] * rows)}")
            self._push_sql[rows] = sql
        return sql


_side = threading.local()
_LOCK_WAIT_TIMEOUT = 1205  # ER_LOCK_WAIT_TIMEOUT


def _side_connection(alias: str) -> Any:
    """A second connection to ``alias`` for this thread (autocommit, not in ``connections``:
    Django's request and worker clean-ups never close it; it reconnects when used after a
    ``close()``). A forked child makes its own."""
    held = getattr(_side, "held", None)
    if held is None or held[0] != os.getpid():
        held = _side.held = (os.getpid(), {})
    wrapper = held[1].get(alias)
    if wrapper is None:
        wrapper = held[1][alias] = connections.create_connection(alias)
    return wrapper


#: The first server versions with ``SELECT … FOR UPDATE SKIP LOCKED``.
SKIP_LOCKED_SINCE = {"MariaDB": (10, 6), "MySQL": (8, 0, 1)}


def missing_skip_locked(connection: Any) -> str | None:
    """Why the database behind ``connection`` cannot claim with ``FOR UPDATE SKIP LOCKED``
    (naming its server and version), or ``None`` when it can. SQLite needs none: it has one
    writer at a time."""
    if connection.vendor == "sqlite" or connection.features.has_select_for_update_skip_locked:
        return None
    if connection.vendor == "mysql":
        server = "MariaDB" if connection.mysql_is_mariadb else "MySQL"
        version = ".".join(map(str, connection.mysql_version))
        needed = ".".join(map(str, SKIP_LOCKED_SINCE[server]))
        return (f"{server} {version} has no SELECT ... FOR UPDATE SKIP LOCKED "
                f"(jobguard needs {server} >= {needed})")
    return f"{connection.display_name} has no SELECT ... FOR UPDATE SKIP LOCKED"
