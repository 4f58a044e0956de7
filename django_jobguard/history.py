"""Per-queue, per-minute counts of finished and failed jobs: what the dashboard's history
charts read, kept in the database so that they survive workers coming and going.

Each worker counts the outcomes of its jobs per queue in memory (:class:`QueueCounter`, fed
where the worker feeds its last-minute counts) and adds them, at each heartbeat, to the
:class:`~django_jobguard.models.QueueMinute` row of the current minute by the database clock,
in one ``INSERT ... ON CONFLICT DO UPDATE`` (``ON DUPLICATE KEY UPDATE`` on MySQL/MariaDB;
the statement is the dialect's, ``Dialect.add_queue_counts``) that adds to what other
workers wrote: no read-modify-write, so no lost update between
workers. A job is counted in the minute of the heartbeat after it ended (at most one
heartbeat interval, ``RETRY_AFTER / 3`` capped at 15 s, late). Housekeeping deletes rows
older than :data:`KEEP`.

The finished-job history (``JOBGUARD["HISTORY"]``: ``"off"``, ``"failures"`` or ``"all"``)
keeps one :class:`~django_jobguard.models.FinishedRun` row per finished run. The worker's
:class:`RunRecorder`, hooked into :func:`django_jobguard.observe.job_line` (which every
final state passes through, after the ack or fail is written, per job or in a group), buffers
the runs in memory: one tuple of the row's fields and a timestamp per run, appended under a
lock, nothing formatted, converted or encoded in the job's thread. The heartbeat describes
them (:func:`run_of`: datetimes, wait, the arguments) and inserts them in one statement
(:meth:`RunRecorder.flush`; on PostgreSQL one ``INSERT ... SELECT FROM unnest(...)`` of one
array per column, elsewhere one ``executemany``). With history off no recorder is installed:
nothing runs per job. A worker killed with
``kill -9`` loses the runs it finished since its last heartbeat (at most one heartbeat
interval's); a run is never recorded twice (only the worker whose ack or fail succeeded
writes it, and a retried flush is ignored by the ``(job_id, finished_at)`` constraint).
Housekeeping deletes runs older than ``HISTORY_RETENTION_DAYS`` in batches
(:func:`prune_runs`). :func:`run_statistics` gives runs, failures and runtime/wait
percentiles per job class and queue: from the runs up to :data:`EXACT_UP_TO` runs in the
window, above it from the :class:`~django_jobguard.models.RunStatistic` rows (per minute and
per hour, with runtime and wait histograms) that :func:`insert_runs` adds to with the runs it
inserts (on PostgreSQL in the same statement, from what it inserted).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, transaction
from django.db.models import Max, Min, Q, Sum, Value
from django.db.models.constants import OnConflict
from django.utils import timezone

from django_jobguard import clock, observe, signals
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.dialects import dialect_for
from django_jobguard.envelope import encoded_size
from django_jobguard.models import STATISTIC_COLUMNS, FinishedRun, QueueMinute, RunStatistic
from django_jobguard.outcome import JobState

if TYPE_CHECKING:
    from django_jobguard.dialects.postgresql import PostgreSQLDialect

try:
    import psycopg
except ImportError:  # psycopg2: the executemany path
    psycopg = None  # type: ignore[assignment]

#: How long minute rows are kept: the 24 h chart plus a day of slack.
KEEP = datetime.timedelta(days=2)

#: Outcomes counted as done (``JobState.finished()``, as the worker's ``RecentOutcomes``).
DONE_STATES = JobState.finished()
FAILED_STATE = JobState.FAILED


class QueueCounter:
    """A worker's done and failed jobs per queue since its last :meth:`flush` (thread-safe:
    ``--concurrency`` threads and the heartbeat thread share it)."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def record(self, queue: str, state: str) -> None:
        """Count one outcome of a job of ``queue`` (releases and the like are not counted)."""
        failed = state == FAILED_STATE
        if not failed and state not in DONE_STATES:
            return
        with self._lock:
            self._counts.setdefault(queue, [0, 0])[1 if failed else 0] += 1

    def pending(self) -> dict[str, tuple[int, int]]:
        """``{queue: (done, failed)}`` not written yet."""
        with self._lock:
            return {queue: (c[0], c[1]) for queue, c in self._counts.items()}

    def flush(self, using: str | None = None) -> int:
        """Add the counts to the current minute's rows; returns how many rows were written.
        If the write fails the counts are kept for the next flush (and the error raised)."""
        with self._lock:
            taken, self._counts = self._counts, {}
        if not taken:
            return 0
        try:
            return add_counts({q: (c[0], c[1]) for q, c in taken.items()}, using=using)
        except BaseException:
            with self._lock:
                for queue, (done, failed) in taken.items():
                    counts = self._counts.setdefault(queue, [0, 0])
                    counts[0] += done
                    counts[1] += failed
            raise


def current_minute(using: str | None = None) -> datetime.datetime:
    """The database clock's current minute (seconds dropped), aware UTC."""
    now = dialect_for(queue_database(using)).now() + datetime.timedelta(seconds=clock.offset())
    return now.replace(second=0, microsecond=0)


def add_counts(counts: Mapping[str, tuple[int, int]], *, minute: datetime.datetime | None = None,
               using: str | None = None) -> int:
    """Add ``{queue: (done, failed)}`` to the rows of ``minute`` (default: now, database
    clock) in one atomic upsert statement; returns the number of queues written."""
    rows = [(queue, done, failed) for queue, (done, failed) in counts.items()
            if done or failed]
    if not rows:
        return 0
    using = queue_database(using)
    minute = minute or current_minute(using)
    # One order everywhere, so two workers' statements lock rows in the same order.
    dialect_for(using).add_queue_counts(minute, sorted(rows))
    return len(rows)


def prune(*, older_than: datetime.timedelta = KEEP, using: str | None = None) -> int:
    """Delete the minutes older than ``older_than`` (database clock); returns how many."""
    using = queue_database(using)
    old = QueueMinute.objects.using(using).filter(
        minute__lt=clock.db_now() - Value(older_than))
    return old._raw_delete(using)


# -- finished-job history -------------------------------------------------------------------

logger = logging.getLogger("django_jobguard.history")

#: The states a run is recorded in with ``HISTORY = "all"`` (``"failures"``: FAILED only).
RECORDED_STATES = frozenset({*JobState.finished(), JobState.FAILED})
#: Rows one housekeeping round deletes at most (the rest waits for the next round).
PRUNE_BATCH = 1000
#: Runs kept in memory at most when flushes keep failing (the oldest are dropped, logged).
MAX_BUFFERED = 50_000


def history_mode() -> str:
    """``JOBGUARD["HISTORY"]``: ``"off"``, ``"failures"`` or ``"all"``."""
    return str(jobguard_settings.HISTORY)


def history_retention() -> datetime.timedelta:
    """How long finished runs are kept (``HISTORY_RETENTION_DAYS``)."""
    return datetime.timedelta(days=jobguard_settings.HISTORY_RETENTION_DAYS)


class RunRecorder:
    """A worker's finished runs not written yet (thread-safe): :meth:`record` is called from
    :func:`~django_jobguard.observe.job_line` in the job's thread, :meth:`flush` from the
    heartbeat.

    The job's thread only appends a :data:`Note` (the row's fields as they are, the time, the
    result size): the conversions wait for the flush, off the jobs' path."""

    def __init__(self, worker_id: str, *, failures_only: bool = False) -> None:
        self.worker_id = worker_id
        self.states = frozenset({JobState.FAILED}) if failures_only else RECORDED_STATES
        self._runs: list[Note] = []
        self._lock = threading.Lock()
        #: Result sizes by job id, from ``job_processed`` until the job's line comes.
        self._sizes: dict[str, int | None] = {}

    def start(self) -> None:
        """Record the job lines from now on (and the result sizes that precede them)."""
        observe.add_run_recorder(self)
        if self.states is RECORDED_STATES:
            signals.job_processed.connect(self.processed, weak=False,
                                          dispatch_uid=f"jobguard-history-{id(self)}")

    def stop(self) -> None:
        """Stop recording (what is buffered stays for :meth:`flush`)."""
        observe.remove_run_recorder(self)
        signals.job_processed.disconnect(dispatch_uid=f"jobguard-history-{id(self)}")

    def processed(self, sender: Any = None, *, job_id: Any = None, result: Any = None,
                  **kwargs: Any) -> None:
        """``job_processed``: note the size of the result, which the job line does not carry
        (sent in the pipeline just before the line; the line takes the note). ``None`` (no
        result) is what a missing note means: nothing to note."""
        if job_id is None or result is None:
            return
        try:
            size: int | None = encoded_size(result)
        except (TypeError, ValueError):
            size = encoded_size(repr(result))  # stored as its repr, as results.py does
        with self._lock:
            self._sizes[str(job_id)] = size

    def __call__(self, worker_id: str, row: Any, state: str, elapsed: float | None,
                 detail: str) -> None:
        """Buffer the run of ``row`` that ended in ``state`` (other workers' lines, and
        states not kept, are ignored)."""
        size = None
        if self._sizes:  # every line ends the note of its job, whichever worker ran it
            with self._lock:
                size = self._sizes.pop(str(row.id), None)
        if state not in self.states or worker_id != self.worker_id:
            return
        try:
            note = (row.id, state, row.name, row.queue, row.payload, row.attempts,
                    getattr(row, "available_at", None), getattr(row, "reserved_at", None),
                    elapsed, detail, time.time(), size, getattr(row, "tags", "") or "")
        except Exception:  # history must never break a job's outcome
            logger.exception("Could not record the run of %s.", getattr(row, "id", row))
            return
        with self._lock:
            self._runs.append(note)
            if len(self._runs) > MAX_BUFFERED:
                del self._runs[:len(self._runs) - MAX_BUFFERED]
                logger.error("Finished-run history: more than %d runs could not be written; "
                             "the oldest were dropped.", MAX_BUFFERED)

    def pending(self) -> int:
        """How many runs wait for the next flush."""
        with self._lock:
            return len(self._runs)

    def flush(self, using: str | None = None) -> int:
        """Insert the buffered runs in one statement; returns how many. If the write fails
        they are kept for the next flush (and the error raised): described again from the
        same notes, they are the same rows, and the ones already written are skipped."""
        with self._lock:
            taken, self._runs = self._runs, []
        if not taken:
            return 0
        try:
            insert_notes(self.worker_id, taken, using=using)
        except BaseException:
            with self._lock:
                self._runs[:0] = taken
            raise
        return len(taken)


#: What :meth:`RunRecorder.__call__` buffers per run: ``(id, state, name, queue, payload,
#: attempts, available_at, reserved_at, elapsed, detail, time.time() at the end,
#: result_size, tags)``.
Note = tuple[Any, str, str, str, Any, int, Any, Any, "float | None", str, float, "int | None",
             str]


#: The columns of a buffered run, in the order of :func:`run_of`'s tuple.
COLUMNS = ("job_id", "state", "name", "queue", "arguments", "attempt", "worker", "started_at",
           "finished_at", "runtime", "wait", "result_size", "error", "tags")
#: The columns whose values the database backend adapts (the others go as they are).
_ADAPTED = frozenset({"job_id", "arguments", "started_at", "finished_at"})


def run_of(worker_id: str, note: Note, *, shift: float = 0.0) -> tuple[Any, ...]:
    """The values (:data:`COLUMNS`) of the run buffered as ``note`` (:data:`Note`);
    ``shift``: the test clock's offset (:func:`django_jobguard.clock.offset`)."""
    (job_id, state, name, queue, payload, attempts, due, reserved, elapsed, detail, ended,
     result_size, tags) = note
    finished = datetime.datetime.fromtimestamp(ended + shift, tz=datetime.UTC)
    started = finished - datetime.timedelta(seconds=elapsed or 0.0)
    payload = payload if isinstance(payload, dict) else {}
    wait = None
    if isinstance(due, datetime.datetime) and isinstance(reserved, datetime.datetime):
        wait = max((reserved - due).total_seconds(), 0.0)
    return (job_id, str(state), name, queue,
            {"args": payload.get("args", []), "kwargs": payload.get("kwargs", {})},
            attempts, worker_id[:100], started, finished, elapsed, wait, result_size,
            detail if state == JobState.FAILED else "", tags)


def describe(worker_id: str, notes: Sequence[Note]) -> list[tuple[Any, ...]]:
    """The rows (:data:`COLUMNS`) of ``notes``; a note that cannot be described is dropped and
    logged (one bad row must not hold back every flush after it)."""
    shift = clock.offset()
    runs = []
    for note in notes:
        try:
            _arguments_json(note[4])  # arguments that cannot be stored fail here, not the insert
            runs.append(run_of(worker_id, note, shift=shift))
        except Exception:
            logger.exception("Could not record the run of %s.", note[0])
    return runs


def note_of(row: Any, state: str, elapsed: float | None = None, detail: str = "", *,
            ended: float | None = None, result_size: int | None = None) -> Note:
    """The :data:`Note` of ``row``'s run ending now (or at ``ended``, a ``time.time()``), as
    :class:`RunRecorder` buffers it: for callers and tests that write runs themselves."""
    return (row.id, state, row.name, row.queue, row.payload, row.attempts,
            getattr(row, "available_at", None), getattr(row, "reserved_at", None), elapsed,
            detail, time.time() if ended is None else ended, result_size,
            getattr(row, "tags", "") or "")


def insert_runs(runs: list[tuple[Any, ...]], *, using: str | None = None) -> None:
    """Insert runs (:data:`COLUMNS` tuples) in one statement that skips a run already there
    (the ``(job_id, finished_at)`` constraint). PostgreSQL with psycopg 3: one
    ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING`` of one array per column,
    bound on the server (:func:`_insert_runs_unnest`). Elsewhere one ``executemany`` of a
    one-row ``INSERT`` (``INSERT IGNORE``, ``INSERT OR IGNORE``). Raw SQL of plain tuples:
    ``bulk_create`` compiled each row's every field."""
    if not runs:
        return
    using = queue_database(using)
    connection = connections[using]
    if psycopg is not None and connection.vendor == "postgresql":
        _insert_runs_unnest(runs, connection)
        return
    by_name = {field.name: field for field in FinishedRun._meta.concrete_fields}
    fields = [by_name[name] for name in COLUMNS]
    adapt = [(i, field) for i, field in enumerate(fields) if field.name in _ADAPTED]
    ops = connection.ops
    table = ops.quote_name(FinishedRun._meta.db_table)
    columns = ", ".join(ops.quote_name(str(field.column)) for field in fields)
    insert = ops.insert_statement(on_conflict=OnConflict.IGNORE)
    suffix = ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, None, None) or ""
    row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params: list[list[Any]] = []
    for run in runs:
        values = list(run)
        for i, field in adapt:
            values[i] = field.get_db_prep_value(values[i], connection)
        params.append(values)
    # One statement's shape for every row: the driver parses it once (psycopg sends the rows
    # in pipeline mode, mysqlclient folds them into multi-row INSERTs); one huge VALUES list
    # cost more to parse for its placeholders than the rows themselves.
    job_id, finished_at = COLUMNS.index("job_id"), COLUMNS.index("finished_at")
    with transaction.atomic(using=using), connection.cursor() as cursor:
        # A retried flush: the runs written already are skipped, and not counted again.
        there = set(FinishedRun.objects.using(using).filter(
            job_id__in={run[job_id] for run in runs}).values_list("job_id", "finished_at"))
        cursor.executemany(f"{insert} {table} ({columns}) VALUES {row_sql} {suffix}", params)
        add_statistics(statistics_of([run for run in runs if (
            _uuid(run[job_id]), run[finished_at]) not in there] if there else runs),
            using=using)


def insert_notes(worker_id: str, notes: Sequence[Note], *, using: str | None = None) -> None:
    """Insert the runs buffered as ``notes`` (:data:`Note`) by ``worker_id``. PostgreSQL with
    psycopg 3: the notes' fields go as they are, one array per field (times as epoch
    seconds), and the server describes them (:func:`_notes_sql`: finished and started at,
    wait, error) in the statement that inserts them and adds their statistics: the worker
    converts nothing per run but the arguments' JSON and two timestamps. Elsewhere
    :func:`run_of` describes each run in Python, then :func:`insert_runs`."""
    if not notes:
        return
    using = queue_database(using)
    connection = connections[using]
    if psycopg is None or connection.vendor != "postgresql":
        insert_runs(describe(worker_id, notes), using=using)
        return
    try:
        arguments = [_arguments_json(note[4]) for note in notes]
    except Exception:  # one bad note must not hold back every flush after it: drop it
        kept = []
        for note in notes:
            try:
                _arguments_json(note[4])
                kept.append(note)
            except Exception:
                logger.exception("Could not record the run of %s.", note[0])
        notes = kept
        if not notes:
            return
        arguments = [_arguments_json(note[4]) for note in notes]
    (ids, states, names, queues, _, attempts, dues, reserveds, elapsed, details, ended,
     sizes, tags) = (list(column) for column in zip(*notes, strict=True))
    Datetime = datetime.datetime
    dues = [d.timestamp() if isinstance(d, Datetime) else None for d in dues]
    reserveds = [r.timestamp() if isinstance(r, Datetime) else None for r in reserveds]
    params: list[Any] = [worker_id[:100], clock.offset(), ids, states, names, queues,
                         arguments, attempts, dues, reserveds, elapsed, details, ended, sizes,
                         tags]
    _postgresql(connection).execute(_notes_sql(connection), params, prepare=False)


def _postgresql(connection: Any) -> PostgreSQLDialect:
    """The dialect of a PostgreSQL ``connection``: its statement runner (a server-binding
    psycopg cursor; Django's own when it logs queries, so tests see the statement)."""
    return cast("PostgreSQLDialect", dialect_for(connection.alias))


def _arguments_json(payload: Any) -> str:
    """The JSON of a run's arguments (``{"args", "kwargs"}``), as :func:`run_of` keeps them."""
    if not isinstance(payload, dict):
        return '{"args": [], "kwargs": {}}'
    return json.dumps({"args": payload.get("args", []), "kwargs": payload.get("kwargs", {})})


_notes_statement: str | None = None


def _notes_sql(connection: Any) -> str:
    """PostgreSQL: the ``INSERT ... SELECT FROM unnest(...)`` of :func:`insert_notes`, with
    :func:`run_of`'s description in SQL, and the statistics of what it inserted (built
    once)."""
    global _notes_statement
    if _notes_statement is None:
        quote = connection.ops.quote_name
        column = {f.name: quote(str(f.column)) for f in FinishedRun._meta.concrete_fields}
        fields = [("job_id", "uuid"), ("state", "text"), ("name", "text"), ("queue", "text"),
                  ("arguments", "text"), ("attempt", "integer"), ("due", "float8"),
                  ("reserved", "float8"), ("elapsed", "float8"), ("detail", "text"),
                  ("ended", "float8"), ("result_size", "integer"), ("tags", "text")]
        finished = "to_timestamp(r.ended + %b::float8)"
        values = {
            "job_id": "r.job_id", "state": "r.state", "name": "r.name", "queue": "r.queue",
            "arguments": "r.arguments::jsonb", "attempt": "r.attempt", "worker": "w.worker",
            "started_at": f"{finished} - make_interval(secs => coalesce(r.elapsed, 0))",
            "finished_at": finished, "runtime": "r.elapsed",
            "wait": "CASE WHEN r.reserved >= r.due THEN r.reserved - r.due "
                    "WHEN r.reserved < r.due THEN 0 END", "result_size": "r.result_size",
            "error": f"CASE WHEN r.state = '{FAILED_STATE}' THEN r.detail ELSE '' END",
            "tags": "r.tags"}
        # Two parameters of the shift: each placeholder is bound once, in order.
        selected = ", ".join(values[name] for name in COLUMNS)
        selected = selected.replace("%b::float8", "w.shift")
        insert = (
            f"INSERT INTO {quote(FinishedRun._meta.db_table)} "
            f"({', '.join(column[name] for name in COLUMNS)}) "
            f"SELECT {selected} FROM (SELECT %b::text AS worker, %b::float8 AS shift) AS w, "
            f"unnest({', '.join(f'%b::{kind}[]' for _, kind in fields)}) "
            f"AS r({', '.join(name for name, _ in fields)}) ON CONFLICT DO NOTHING")
        _notes_statement = _statistics_sql(
            f"{insert} RETURNING {_returned(connection)}", connection)
    return _notes_statement


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _insert_runs_unnest(runs: list[tuple[Any, ...]], connection: Any) -> None:
    """PostgreSQL: the runs as one array per column, unnested into one ``INSERT``, through a
    server-binding psycopg cursor on Django's connection (no client-side quoting of the
    arrays; Django's own cursor when it logs queries, so tests see the statement). The
    server runs one statement instead of one per row; the arguments go as ``text[]`` of
    JSON, cast to ``jsonb`` in the ``SELECT``."""
    columns = [list(column) for column in zip(*runs, strict=True)]
    arguments = COLUMNS.index("arguments")
    columns[arguments] = [json.dumps(value) for value in columns[arguments]]
    _postgresql(connection).execute(_unnest_sql(connection), columns, prepare=False)


_unnest_statement: str | None = None


def _unnest_sql(connection: Any) -> str:
    """The ``INSERT ... SELECT FROM unnest(...)`` of :func:`_insert_runs_unnest` (built once:
    the table's column types, JSON as text)."""
    global _unnest_statement
    if _unnest_statement is None:
        by_name = {field.name: field for field in FinishedRun._meta.concrete_fields}
        quote = connection.ops.quote_name
        columns = [quote(str(by_name[name].column)) for name in COLUMNS]
        types = ["text" if name == "arguments" else by_name[name].db_type(connection)
                 for name in COLUMNS]
        selected = [f"{column}::jsonb" if name == "arguments" else column
                    for name, column in zip(COLUMNS, columns, strict=True)]
        _unnest_statement = (
            f"INSERT INTO {quote(FinishedRun._meta.db_table)} ({', '.join(columns)}) "
            f"SELECT {', '.join(selected)} FROM unnest("
            f"{', '.join(f'%b::{kind}[]' for kind in types)}) AS r({', '.join(columns)}) "
            f"ON CONFLICT DO NOTHING")
        _unnest_statement = _statistics_sql(
            f"{_unnest_statement} RETURNING {_returned(connection)}", connection)
    return _unnest_statement


def _returned(connection: Any) -> str:
    """The run columns :func:`_statistics_sql` reads, named as it reads them."""
    quote = connection.ops.quote_name
    run = {field.name: quote(str(field.column)) for field in FinishedRun._meta.concrete_fields}
    return ", ".join(f"{run[name]} AS {name}" for name in (
        "name", "queue", "state", "runtime", "wait", "finished_at"))


def _statistics_sql(runs: str, connection: Any) -> str:
    """PostgreSQL: the statement that adds the runs ``runs`` returns (an ``INSERT ...
    RETURNING`` of the runs, a data-modifying CTE: a run already there is not returned, so
    not counted again; or a ``SELECT``) to the :class:`RunStatistic` rows of their minute
    and hour, aggregated by the server: the worker sends the runs once and computes nothing
    per run."""
    quote = connection.ops.quote_name
    stat = {field.name: quote(str(field.column))
            for field in RunStatistic._meta.concrete_fields}
    table = quote(RunStatistic._meta.db_table)

    def bucket(column: str) -> str:
        return (f"CASE WHEN {column} < {BUCKET_FLOOR!r} THEN 0 ELSE LEAST(1 + floor(ln("
                f"{column} / {BUCKET_FLOOR!r}) / ln({BUCKET_FACTOR!r}))::int, {LAST_BUCKET}) END")

    key = "period, name, queue"
    # Each run is read once, into its minute's rows; the hour rows are summed from those.
    minutes = (
        f"SELECT {key}, -1 AS bucket, count(*) AS runs, "
        f"count(*) FILTER (WHERE state = '{FAILED_STATE}') AS failures, 0::bigint AS runtimes, "
        f"0::bigint AS waits, min(runtime) AS rmin, max(runtime) AS rmax, min(wait) AS wmin, "
        f"max(wait) AS wmax FROM r GROUP BY {key} "
        f"UNION ALL SELECT {key}, rb, 0, 0, count(*), 0, NULL, NULL, NULL, NULL "
        f"FROM r WHERE rb IS NOT NULL GROUP BY {key}, rb "
        f"UNION ALL SELECT {key}, wb, 0, 0, 0, count(*), NULL, NULL, NULL, NULL "
        f"FROM r WHERE wb IS NOT NULL GROUP BY {key}, wb")
    rest = "name, queue, bucket, runs, failures, runtimes, waits, rmin, rmax, wmin, wmax"
    spans = (f"SELECT {MINUTE} AS span, period, {rest} FROM m UNION ALL "
             f"SELECT {HOUR}, to_timestamp(floor(extract(epoch FROM period) / {HOUR}) * {HOUR}),"
             f" {rest} FROM m")
    target = ", ".join(stat[name] for name in STATISTIC_COLUMNS)
    added = ", ".join(f"{stat[name]} = {table}.{stat[name]} + excluded.{stat[name]}"
                      for name in ("runs", "failures", "runtimes", "waits"))
    least = ", ".join(f"{stat[name]} = {fn}({table}.{stat[name]}, excluded.{stat[name]})"
                      for name, fn in (("runtime_min", "LEAST"), ("runtime_max", "GREATEST"),
                                       ("wait_min", "LEAST"), ("wait_max", "GREATEST")))
    conflict = ", ".join(stat[name] for name in ("span", "period", "name", "queue", "bucket"))
    return (
        f"WITH ins AS ({runs}), "
        f"r AS (SELECT date_trunc('minute', finished_at) AS period, name, queue, state, "
        f"runtime, wait, {bucket('runtime')} AS rb, {bucket('wait')} AS wb FROM ins), "
        f"m AS ({minutes}), s AS ({spans}) "
        f"INSERT INTO {table} ({target}) "
        f"SELECT span, {key}, bucket, sum(runs), sum(failures), sum(runtimes), sum(waits), "
        f"min(rmin), max(rmax), min(wmin), max(wmax) FROM s "
        f"GROUP BY span, {key}, bucket ORDER BY span, {key}, bucket "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {added}, {least}")


def prune_runs(*, older_than: datetime.timedelta | None = None, using: str | None = None,
               batch: int = PRUNE_BATCH) -> int:
    """Delete up to ``batch`` runs older than ``older_than`` (default
    ``HISTORY_RETENTION_DAYS``), oldest first; returns how many."""
    using = queue_database(using)
    cutoff = timezone.now() - (older_than if older_than is not None else history_retention())
    old = FinishedRun.objects.using(using).filter(finished_at__lt=cutoff)
    ids = list(old.order_by("finished_at").values_list("id", flat=True)[:batch])
    if not ids:
        return 0
    return FinishedRun.objects.using(using).filter(id__in=ids)._raw_delete(using)


#: The windows of :func:`run_statistics`.
WINDOWS = {"1h": datetime.timedelta(hours=1), "24h": datetime.timedelta(days=1),
           "7d": datetime.timedelta(days=7)}

# -- pre-aggregated statistics (RunStatistic) ----------------------------------------------

#: The periods runs are aggregated in, seconds: minutes (the 1 h window and the recent edge of
#: the others) and hours (the body of the 24 h and 7 d windows).
MINUTE, HOUR = 60, 3600
SPANS = (MINUTE, HOUR)
#: Histogram buckets: bucket 0 holds the values under ``BUCKET_FLOOR`` seconds (0.1 ms),
#: bucket ``b >= 1`` the values in ``[FLOOR * FACTOR**(b-1), FLOOR * FACTOR**b)``: eight
#: buckets per doubling, so a percentile read from them is within 9 % of the exact one (the
#: smallest and largest value of the period are kept exactly and bound it).
BUCKET_FLOOR = 0.0001
BUCKET_FACTOR = 2 ** (1 / 8)
#: The last bucket (values from about 21 days up).
LAST_BUCKET = 300
#: The summary row of a period (runs, failures, smallest and largest runtime and wait).
SUMMARY = -1
#: Up to this many runs in a window the statistics are exact (read from the runs, an index
#: range); above it they come from the per-minute and per-hour rows (``estimated``).
EXACT_UP_TO = 10_000
#: The columns of a :class:`RunStatistic` row, in the order of :func:`statistics_of`'s tuples.
_LOG_FACTOR = math.log(BUCKET_FACTOR)


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a runtime or wait (see :data:`BUCKET_FLOOR`)."""
    if seconds < BUCKET_FLOOR:
        return 0
    return min(1 + math.floor(math.log(seconds / BUCKET_FLOOR) / _LOG_FACTOR), LAST_BUCKET)


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """``[low, high)`` seconds of ``bucket`` (the last one's high is infinite)."""
    if bucket <= 0:
        return 0.0, BUCKET_FLOOR
    high = math.inf if bucket >= LAST_BUCKET else BUCKET_FLOOR * BUCKET_FACTOR ** bucket
    return BUCKET_FLOOR * BUCKET_FACTOR ** (bucket - 1), high


def _period(moment: datetime.datetime, span: int) -> datetime.datetime:
    stamp = moment.timestamp()
    return datetime.datetime.fromtimestamp(stamp - stamp % span, tz=datetime.UTC)


def statistics_of(runs: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The :class:`RunStatistic` rows (:data:`STATISTIC_COLUMNS` tuples, in key order) that
    ``runs`` (:data:`COLUMNS` tuples) add: what PostgreSQL computes itself in
    :func:`insert_runs`' statement, for the other databases."""
    i = {name: COLUMNS.index(name) for name in ("name", "queue", "state", "runtime", "wait",
                                                "finished_at")}
    rows: dict[tuple[Any, ...], list[Any]] = {}

    def row(key: tuple[Any, ...]) -> list[Any]:
        found = rows.get(key)
        if found is None:
            found = rows[key] = [0, 0, 0, 0, None, None, None, None]
        return found

    for run in runs:
        runtime, wait = run[i["runtime"]], run[i["wait"]]
        for span in SPANS:
            base = (span, _period(run[i["finished_at"]], span), run[i["name"]], run[i["queue"]])
            summary = row((*base, SUMMARY))
            summary[0] += 1
            summary[1] += run[i["state"]] == FAILED_STATE
            for value, low in ((runtime, 4), (wait, 6)):
                if value is None:
                    continue
                if summary[low] is None or value < summary[low]:
                    summary[low] = value
                if summary[low + 1] is None or value > summary[low + 1]:
                    summary[low + 1] = value
            if runtime is not None:
                row((*base, bucket_of(runtime)))[2] += 1
            if wait is not None:
                row((*base, bucket_of(wait)))[3] += 1
    return [(*key, *values) for key, values in sorted(rows.items(), key=lambda kv: kv[0])]


def add_statistics(rows: Sequence[tuple[Any, ...]], *, using: str | None = None) -> None:
    """Add :func:`statistics_of` rows to the :class:`RunStatistic` table (one additive upsert:
    ``Dialect.add_run_statistics``)."""
    if rows:
        dialect_for(queue_database(using)).add_run_statistics(rows)


def rebuild_statistics(*, using: str | None = None) -> int:
    """The :class:`RunStatistic` rows made anew from the runs there are (a migration from a
    version without them, a bench that fills the runs with SQL); returns the runs counted."""
    using = queue_database(using)
    connection = connections[using]
    with transaction.atomic(using=using):
        RunStatistic.objects.using(using).all()._raw_delete(using)
        if connection.vendor == "postgresql":
            table = connection.ops.quote_name(FinishedRun._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(_statistics_sql(
                    f"SELECT {_returned(connection)} FROM {table}", connection))
            return FinishedRun.objects.using(using).count()
        total = 0
        runs = FinishedRun.objects.using(using).order_by().values_list(*COLUMNS)
        chunk: list[tuple[Any, ...]] = []
        for run in runs.iterator(chunk_size=5000):
            chunk.append(run)
            if len(chunk) == 5000:
                add_statistics(statistics_of(chunk), using=using)
                total += len(chunk)
                chunk = []
        add_statistics(statistics_of(chunk), using=using)
        return total + len(chunk)


def prune_statistics(*, using: str | None = None) -> int:
    """Delete the minute rows older than :data:`KEEP` and the hour rows older than
    ``HISTORY_RETENTION_DAYS`` (as the runs); returns how many."""
    using = queue_database(using)
    now = timezone.now()
    old = RunStatistic.objects.using(using).filter(
        Q(span=MINUTE, period__lt=_period(now - KEEP, MINUTE))
        | Q(span=HOUR, period__lt=_period(now - history_retention(), HOUR)))
    return old._raw_delete(using)


def _window_rows(since: datetime.datetime, now: datetime.datetime) -> Q:
    """The :class:`RunStatistic` rows of ``[since, now]``: whole hours from the first hour
    boundary after ``since`` to the current hour's start, minutes before and after them
    (the minutes older than :data:`KEEP` are pruned: a 7 d window starts at its first whole
    hour)."""
    start = _period(since, MINUTE)
    first_hour = _period(since + datetime.timedelta(seconds=HOUR - 1), HOUR)
    this_hour = _period(now, HOUR)
    return (Q(span=HOUR, period__gte=first_hour, period__lt=this_hour)
            | Q(span=MINUTE, period__gte=start, period__lt=first_hour)
            | Q(span=MINUTE, period__gte=max(this_hour, start)))


def run_statistics(window: str = "24h", *, exact_up_to: int = EXACT_UP_TO,
                   using: str | None = None) -> list[dict[str, Any]]:
    """Per job class and queue, over the last ``window`` (``"1h"``, ``"24h"``, ``"7d"``):
    runs, failures, and p50/p95/max of runtime and wait (seconds), slowest p95 first;
    ``estimated``: whether the percentiles come from the histograms.

    The per-minute and per-hour :class:`RunStatistic` rows are read first (a few thousand
    rows for a week). Up to ``exact_up_to`` runs in the window the figures are then computed
    from the runs themselves, exactly: PostgreSQL computes the percentiles
    (``percentile_cont``), other databases in Python. Above it they come from the rows:
    runs, failures and max exact (to the minute, the window's first hour to the hour), the
    percentiles interpolated in their histogram bucket (within 9 %)."""
    if window not in WINDOWS:
        raise ValueError(f"Unknown window {window!r}: one of {', '.join(WINDOWS)}.")
    using = queue_database(using)
    now = timezone.now()
    since = now - WINDOWS[window]
    aggregated = cast(list[dict[str, Any]], list(
        RunStatistic.objects.using(using).filter(_window_rows(since, now))
        .values("name", "queue", "bucket").order_by()
        .annotate(runs_=Sum("runs"), failures_=Sum("failures"), runtimes_=Sum("runtimes"),
                  waits_=Sum("waits"), runtime_min_=Min("runtime_min"),
                  runtime_max_=Max("runtime_max"), wait_min_=Min("wait_min"),
                  wait_max_=Max("wait_max"))))
    if sum(row["runs_"] or 0 for row in aggregated if row["bucket"] == SUMMARY) > exact_up_to:
        rows = _statistics_histograms(aggregated)
    elif connections[using].vendor == "postgresql":
        rows = _statistics_postgresql(since, using)
    else:
        rows = _statistics_python(since, using)
    rows.sort(key=lambda r: (-(r["runtime_p95"] or 0.0), r["name"], r["queue"]))
    return rows


_KEYS = ("name", "queue", "runs", "failures", "runtime_p50", "runtime_p95", "runtime_max",
         "wait_p50", "wait_p95", "wait_max")


def _statistics_histograms(aggregated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in aggregated:
        group = groups.setdefault((row["name"], row["queue"]), {
            "summary": None, "runtimes": {}, "waits": {}})
        if row["bucket"] == SUMMARY:
            group["summary"] = row
            continue
        for kind in ("runtimes", "waits"):
            if row[f"{kind}_"]:
                group[kind][row["bucket"]] = row[f"{kind}_"]
    out = []
    for (name, queue), group in groups.items():
        summary = group["summary"]
        if summary is None or not summary["runs_"]:
            continue
        figures: list[Any] = [name, queue, summary["runs_"], summary["failures_"]]
        for kind, low, high in (("runtimes", "runtime_min_", "runtime_max_"),
                                ("waits", "wait_min_", "wait_max_")):
            counts = group[kind]
            figures += [histogram_percentile(counts, 0.5, summary[low], summary[high]),
                        histogram_percentile(counts, 0.95, summary[low], summary[high]),
                        summary[high] if counts else None]
        out.append({**dict(zip(_KEYS, figures, strict=True)), "estimated": True})
    return out


def histogram_percentile(counts: Mapping[int, int], q: float, lowest: float | None,
                         highest: float | None) -> float | None:
    """The ``q`` quantile of the values counted in ``{bucket: count}`` (ranked as
    ``percentile_cont``: position ``q * (n - 1)``), the values of a bucket taken as evenly
    spread over it, bounded by the smallest and largest value seen; None for no values."""
    total = sum(counts.values())
    if not total:
        return None
    rank = q * (total - 1)
    below = 0
    for bucket in sorted(counts):
        count = counts[bucket]
        if rank < below + count or below + count >= total:
            low, high = bucket_bounds(bucket)
            if lowest is not None:
                low = max(low, min(lowest, high))
            if highest is not None:
                high = min(high, highest)
            high = max(high, low)
            share = (rank - below + 0.5) / count if count > 1 else 0.5
            value = low + (high - low) * min(max(share, 0.0), 1.0)
            if lowest is not None and value < lowest:
                value = lowest
            return value if highest is None else min(value, highest)
        below += count
    return highest


def _statistics_postgresql(since: datetime.datetime, using: str) -> list[dict[str, Any]]:
    table = connections[using].ops.quote_name(FinishedRun._meta.db_table)
    sql = f"""SELECT name, queue, count(*), count(*) FILTER (WHERE state = 'FAILED'),
        percentile_cont(0.5) WITHIN GROUP (ORDER BY runtime),
        percentile_cont(0.95) WITHIN GROUP (ORDER BY runtime), max(runtime),
        percentile_cont(0.5) WITHIN GROUP (ORDER BY wait),
        percentile_cont(0.95) WITHIN GROUP (ORDER BY wait), max(wait)
        FROM {table} WHERE finished_at >= %s GROUP BY name, queue"""
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [since])
        return [{**dict(zip(_KEYS, row, strict=True)), "estimated": False}
                for row in cursor.fetchall()]


def _statistics_python(since: datetime.datetime, using: str) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[tuple[str, float | None, float | None]]] = {}
    runs = FinishedRun.objects.using(using).filter(finished_at__gte=since)
    for name, queue, state, runtime, wait in runs.values_list(
            "name", "queue", "state", "runtime", "wait").iterator():
        groups.setdefault((name, queue), []).append((state, runtime, wait))
    out = []
    for (name, queue), items in groups.items():
        runtimes = [r for _, r, _ in items if r is not None]
        waits = [w for _, _, w in items if w is not None]
        out.append({**dict(zip(_KEYS, (
            name, queue, len(items), sum(1 for s, _, _ in items if s == JobState.FAILED),
            percentile(runtimes, 0.5), percentile(runtimes, 0.95), max(runtimes, default=None),
            percentile(waits, 0.5), percentile(waits, 0.95), max(waits, default=None)),
            strict=True)), "estimated": False})
    return out


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` by linear interpolation (as PostgreSQL's
    ``percentile_cont``); None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
