"""PostgreSQL: SKIP LOCKED claims, NOTIFY riding along with the INSERT, LISTEN for idle
workers (after a probe that a NOTIFY reaches it: not through a transaction-pooling PgBouncer,
see :mod:`django_jobguard.pooling`), and the per-job statements (push of one job, claim, ack)
through psycopg's server-binding cursor so that they can be prepared once per connection."""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import DateTimeField

from django_jobguard import clock, pooling
from django_jobguard.conf import jobguard_settings
from django_jobguard.dialects.base import (
    Listener,
    ListenUnavailable,
    ResultListener,
    job_from_values,
    plain_rows,
)
from django_jobguard.dialects.sql import SQLDialect
from django_jobguard.fair_share import FairClaim
from django_jobguard.models import COUNTER_MAX, Batch, PausedQueue, QueuedJob

try:
    import psycopg
except ImportError:  # psycopg2: Django's cursors, and no LISTEN (workers poll at --sleep)
    psycopg = None


def _fast_times(wrapper: Any) -> bool:
    """Whether psycopg's own ``timestamptz`` loader (C, with psycopg's binary or C build) gives
    the connection's rows the same values as Django's: aware times in UTC, which it does when
    Django keeps the session in UTC (``USE_TZ`` and no database ``TIME_ZONE``). Django's
    loader parses each time in Python, which cost a claimed row three times what the rest of
    its loading did."""
    return wrapper.timezone is datetime.UTC and _TIMESTAMPTZ_LOADER is not None


_TIMESTAMPTZ_LOADER = (psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid,
                                                   psycopg.pq.Format.TEXT)
                       if psycopg is not None else None)

if TYPE_CHECKING:
    from django_jobguard.dialects.base import NewJob

NOTIFY_CHANNEL = "jobguard"
#: Where the id of a job whose result was just written is sent (``handle.wait()`` listens).
RESULT_CHANNEL = "jobguard_result"
#: How long a worker starting up waits for its probe NOTIFY (delivered in milliseconds when
#: LISTEN works; the whole wait only when it does not, before the worker falls back to polling).
PROBE_SECONDS = 2.0

# One statement per batch, whatever its size: the rows travel as eight arrays (no per-row SQL
# to compile or quote), delays are added to the database clock, and the NOTIFY rides along in
# the same round trip (delivered when the caller's transaction commits).
_PUSH_SQL = """
    {notify_head}INSERT INTO {table} (id, queue, name, payload, attempts, exceptions, priority,
                             available_at, reserved_by, last_error, fair_key)
    SELECT t.id, t.queue, t.name, t.payload::jsonb, 0, 0, t.priority,
           COALESCE(t.at, {now} + make_interval(secs => COALESCE(t.delay, 0))),
           '', '', t.fair_key
      FROM unnest(%s::uuid[], %s::varchar[], %s::varchar[], %s::text[], %s::smallint[],
                  %s::timestamptz[], %s::float8[], %s::varchar[])
           AS t(id, queue, name, payload, priority, at, delay, fair_key){notify_tail}"""

# A batch whose rows differ only in id and payload (one class in one dispatch_many call: the
# usual batch): those two travel as arrays and the rest once. Six arrays fewer to build, send
# and unnest: psycopg's CPU 2.0-2.7 -> 1.3-1.4 us a row, the statement ~20 % quicker.
_PUSH_SHARED_SQL = """
    {notify_head}INSERT INTO {table} (id, queue, name, payload, attempts, exceptions, priority,
                             available_at, reserved_by, last_error, fair_key)
    SELECT t.id, %s::varchar, %s::varchar, t.payload::jsonb, 0, 0, %s::smallint,
           COALESCE(%s::timestamptz, {now} + make_interval(secs => COALESCE(%s::float8, 0))),
           '', '', %s::varchar
      FROM unnest(%s::uuid[], %s::text[]) AS t(id, payload){notify_tail}"""

# One job (a view's dispatch()): plain VALUES through a server-binding cursor, which psycopg
# can prepare; the batch statement's seven arrays cost more to quote than the row itself.
_PUSH_ONE_SQL = """
    {notify_head}INSERT INTO {table} (id, queue, name, payload, attempts, exceptions, priority,
                             available_at, reserved_by, last_error, fair_key)
    VALUES (%s, %s, %s, %s::jsonb, 0, 0, %s::smallint,
            COALESCE(%s::timestamptz,
                     {now} + make_interval(secs => COALESCE(%s::float8, 0))),
            '', '', %s){notify_tail}"""

_NOTIFY_HEAD = "WITH inserted AS ("
_NOTIFY_TAIL = f"""
    RETURNING queue)
    SELECT pg_notify('{NOTIFY_CHANNEL}', q.queue) FROM (SELECT DISTINCT queue FROM inserted) q"""

# The lease a claim gives the rows of its CTE ``picked``; saturating counters (see below).
_LEASE = """
    UPDATE {table} AS q
       SET attempts = CASE WHEN q.attempts < {max} THEN q.attempts + %(count)s
                           ELSE q.attempts END,
           reserved_at = {now}, reserved_by = %(worker)s,
           claims = CASE WHEN q.claims < {max} THEN q.claims + 1 ELSE q.claims END,
           available_at = {now} + make_interval(secs => %(lease)s)
      FROM picked WHERE q.id = picked.id"""

# One statement: pick due rows in order, skip rows another worker is taking, lease them; a
# paused queue (a row in the paused-queue table) gives nothing.
# The candidates are picked and locked ONCE, in a MATERIALIZED CTE. With the older
# ``WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` a plan made while the table
# looked empty (a cached generic plan, or statistics from autovacuum on a drained queue)
# runs the subquery again for every row of the table: each run sorts the queue and locks
# another row, so a burst of 20k jobs stalled 4 claimers for minutes (bench/throughput.py).
_CLAIM_SQL = """
    WITH picked AS MATERIALIZED (
        SELECT id, reserved_by <> '' AS recovered FROM {table}
         WHERE queue = %(queue)s AND available_at <= {now}
           AND NOT EXISTS (SELECT 1 FROM {paused} WHERE queue = %(queue)s)
         ORDER BY priority DESC, available_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED)""" + _LEASE + """
    RETURNING {columns}, concat_ws('; ', {unloadable}), picked.recovered"""

# Sent before the claim in the same query string (one implicit transaction, one round trip),
# unless the claim goes through a connection of its own whose session has this setting
# (:class:`ClaimConnections`),
# so that the planner takes the rows in claim order from jobguard_claim_idx whatever its
# statistics say. A queue table analyzed while empty (autovacuum on a drained queue) makes it
# expect a handful of due rows; for a batch claim it then preferred a bitmap scan of every
# due row and a sort over the ordered index scan: with a burst of 200,000 jobs behind it each
# claim of 128 took 85-110 ms instead of 5 (tests/unit/dialects/test_claim_plan.py). The
# ordered index scan is the only plan without a sort. Never prepared, as before.
_IN_CLAIM_ORDER = "SET LOCAL enable_sort = off; "

# A fair queue's claim (fair_share.py), in one statement too. It never ranks the whole queue:
# it walks the keys with due rows from the cursor with a skip scan of jobguard_fair_idx (one
# index descent per key: ``after``, the keys after the cursor's, then ``before``, from the
# first key round to the cursor's, and ``carry``, the cursor's own key while its turn is
# unfinished), at most ``limit`` keys that may take a row (under their ``per_key_concurrency``,
# counted in the walk when capped). Each key then locks its first rows in claim order, just
# enough for ``limit`` rows over the keys found (``weight * ceil(limit / keys)``, within its
# cap), SKIP LOCKED; those are ranked (turn, where the key stands from the cursor, the walk,
# the row's rank in its key) and the first ``limit`` leased. ``cand`` and ``picked`` are
# MATERIALIZED for the reason given above: the rows are picked and locked once. The last
# column returned is the row's place in the fair order.
_FAIR_CLAIM_SQL = """
    WITH RECURSIVE
    open AS (SELECT NOT EXISTS (SELECT 1 FROM {paused} WHERE queue = %(queue)s) AS yes),
    after(k, e, n, seen) AS (
        SELECT s.k, s.e, s.e, 1 FROM {step_after_cursor} s WHERE (SELECT yes FROM open)
        UNION ALL
        SELECT s.k, s.e, a.n + s.e, a.seen + 1
          FROM after a CROSS JOIN LATERAL {step_after_a} s
         WHERE a.n < %(keys)s),
    found AS (SELECT COALESCE(max(n), 0) AS n FROM after),
    before(k, e, n, seen) AS (
        SELECT s.k, s.e, s.e, 1 FROM {step_first} s
         WHERE (SELECT yes FROM open) AND (SELECT n FROM found) < %(keys)s
        UNION ALL
        SELECT s.k, s.e, b.n + s.e, b.seen + 1
          FROM before b CROSS JOIN LATERAL {step_after_b} s
         WHERE b.n + (SELECT n FROM found) < %(keys)s),
    carry(k, e) AS (
        SELECT s.k, {eligible} FROM (SELECT %(ckey)s::varchar AS k) s
         WHERE %(cused)s > 0 AND (SELECT yes FROM open)
           AND EXISTS (SELECT 1 FROM {table} WHERE queue = %(queue)s AND fair_key = s.k
                          AND available_at <= {now})),
    keys AS MATERIALIZED (
        SELECT u.k, u.pos, u.seen, COALESCE(wt.w, 1) AS w,
               CASE WHEN u.pos = 0 THEN %(cused)s ELSE 0 END AS off
          FROM (SELECT k, 0 AS pos, 0 AS seen FROM carry WHERE e = 1
                UNION ALL SELECT k, 1, seen FROM after WHERE e = 1
                UNION ALL SELECT k, 2, seen FROM before WHERE e = 1) u
          LEFT JOIN unnest(%(wkeys)s::varchar[], %(wvals)s::int[]) AS wt(k, w) ON wt.k = u.k
         ORDER BY u.pos, u.seen LIMIT %(keys)s),
    cand AS MATERIALIZED (
        SELECT c.id, c.priority, c.available_at, keys.k, keys.pos, keys.seen, keys.w, keys.off
          FROM keys CROSS JOIN LATERAL (
               SELECT id, priority, available_at FROM {table}
                WHERE queue = %(queue)s AND fair_key = keys.k AND available_at <= {now}
                ORDER BY priority DESC, available_at
                LIMIT {take}
                  FOR UPDATE SKIP LOCKED) c),
    picked AS MATERIALIZED (
        SELECT id, row_number() OVER (ORDER BY turn, pos, seen, rn) AS ord FROM (
            SELECT id, pos, seen, rn, (rn - 1 + off) / w AS turn FROM (
                SELECT id, pos, seen, w, off, row_number() OVER (
                           PARTITION BY k ORDER BY priority DESC, available_at) AS rn
                  FROM cand) ranked) turns
         ORDER BY turn, pos, seen, rn
         LIMIT %(limit)s)""" + _LEASE + """
    RETURNING {columns}, concat_ws('; ', {unloadable}), picked.ord"""

# One step of the walk: the next key with a due row after ``{after}`` (the first with none),
# and whether it may take a row now (``e``: 1 or 0); ``before`` stops at the cursor's key.
# (OFFSET 0 keeps the step a subquery: pulled up, its ``e`` would be evaluated, and its row
# locked, once per reference.)
_STEP = """(SELECT x.k, {eligible} AS e FROM (
        SELECT min(fair_key) AS k FROM {table}
         WHERE queue = %(queue)s{after} AND available_at <= {now}) x
     WHERE x.k IS NOT NULL{upto} OFFSET 0)"""
_UPTO_CURSOR = " AND (x.k < %(ckey)s OR (x.k = %(ckey)s AND %(cused)s = 0))"

# A key may take a row (1) or is at its per_key_concurrency (0); ``{key}`` is the key.
_RUNNING = ("(SELECT count(*) FROM {table} WHERE queue = %(queue)s AND fair_key = {key}"
            " AND reserved_at IS NOT NULL AND available_at > {now})")
# A key may take a row only if one of its due rows is not locked by a concurrent claim (which
# is serving it now): workers walking the same keys at once then spread over the keys instead
# of each taking what the other left of the same few (and coming back short). The row found
# is locked by this claim (it takes it below, unless the claim fills up first).
_UNLOCKED = ("EXISTS (SELECT 1 FROM {table} WHERE queue = %(queue)s AND fair_key = {key}"
             " AND available_at <= {now} FOR UPDATE SKIP LOCKED)")
_ELIGIBLE = "CASE WHEN " + _UNLOCKED + " THEN 1 ELSE 0 END"
_ELIGIBLE_CAPPED = ("CASE WHEN " + _RUNNING + " < %(per_key)s AND " + _UNLOCKED
                    + " THEN 1 ELSE 0 END")
# How many rows a key locks: its share of ``limit`` over the keys found, within its budget.
_TAKE = "keys.w * ((%(limit)s + (SELECT count(*) FROM keys) - 1) / (SELECT count(*) FROM keys))"

# The counters saturate at COUNTER_MAX (a row there is quarantined: base.job_from_values), so
# a claim never fails with "integer out of range". A date column the claim does not write
# comes back NULL where psycopg could not load it (infinity, or a year outside 1-9999: the
# whole fetch would raise after the rows were leased, every row of the claim lost), and the
# last column names it for the row's poison reason.
_LOADABLE = "{col} BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'"
_DATE_RETURNED = "CASE WHEN " + _LOADABLE + " THEN {col} END"
_DATE_UNLOADABLE = ("CASE WHEN NOT (" + _LOADABLE + ") THEN '{name} ''' || {col}::text || "
                    "''' cannot be loaded (outside the dates Python has)' END")

_ACK_SQL = """
    WITH acked AS (DELETE FROM {table} WHERE id = %s AND reserved_by = %s AND claims = %s
                   RETURNING 1)
    SELECT (SELECT count(*) FROM acked){relax}"""

# Appended to the last SELECT of an ack (or a start) unless ``SYNCHRONOUS_ACKS``: its commit
# does not wait for its WAL to reach the disk (``synchronous_commit`` is read at commit, and
# ``set_config(..., true)`` lasts until then). A crash of the database server (not of a
# worker) can forget the acks of its last fraction of a second; their rows, still leased,
# run again when the lease ends: at-least-once, as for a worker killed before its ack. A
# later synchronous commit (a job's own writes) flushes the WAL written before it.
_RELAX = ", set_config('synchronous_commit', 'off', true)"

# The start of a row claimed ahead (its attempt counted), as a job thread takes it.
_START_SQL = """
    WITH started AS (UPDATE {table} SET attempts = attempts + 1
                      WHERE id = %s AND reserved_by = %s AND claims = %s RETURNING 1)
    SELECT (SELECT count(*) FROM started){relax}"""

# The starts of several rows claimed ahead (async jobs given free slots at once by the
# coordinator), each (id, claims) owner-checked as one start is: one prepared statement, the
# ids as array literals (the ORM's OR of one condition per row was compiled, and planned,
# anew each time).
_START_MANY_SQL = """
    WITH started AS (UPDATE {table} AS q SET attempts = q.attempts + 1
                       FROM unnest(%s::uuid[], %s::bigint[]) AS s(id, claims)
                      WHERE q.id = s.id AND q.claims = s.claims AND q.reserved_by = %s
                     RETURNING q.id)
    SELECT ARRAY(SELECT id FROM started){relax}"""

# The ack of one job and the start of the next one claimed ahead (its attempt counted), in
# one round trip: with a batch a job costs this statement alone, as it did when claims
# counted every row they leased.
_ACK_AND_START_SQL = """
    WITH acked AS (DELETE FROM {table} WHERE id = %s AND reserved_by = %s AND claims = %s
                   RETURNING 1),
         started AS (UPDATE {table} SET attempts = attempts + 1
                      WHERE id = %s AND reserved_by = %s AND claims = %s RETURNING 1)
    SELECT (SELECT count(*) FROM acked), (SELECT count(*) FROM started){relax}"""

# The ack of a batch member (and the start of the next row, if claimed ahead) with its
# success counted in the batch, in one statement: atomic without a transaction around it.
_ACK_COUNTING_SQL = """
    WITH acked AS (DELETE FROM {table} WHERE id = %s AND reserved_by = %s AND claims = %s
                   RETURNING 1),
         started AS (UPDATE {table} SET attempts = attempts + 1
                      WHERE id = %s AND reserved_by = %s AND claims = %s RETURNING 1),
         counted AS (UPDATE {batch} SET pending_jobs = pending_jobs - 1
                      WHERE id = %s AND pending_jobs > 0 AND EXISTS (SELECT 1 FROM acked)
                  RETURNING pending_jobs, failed_jobs)
    SELECT (SELECT count(*) FROM acked), (SELECT count(*) FROM started),
           (SELECT pending_jobs FROM counted), (SELECT failed_jobs FROM counted){relax}"""


# A completion group (worker/completer.py) in one statement: the finished rows deleted and the
# running rows started, each pair (id, claims) owner-checked as one ack or start is.
_COMPLETE_SQL = """
    WITH acked AS (DELETE FROM {table} AS q USING unnest(%s::uuid[], %s::bigint[]) AS d(id, claims)
                    WHERE q.id = d.id AND q.claims = d.claims AND q.reserved_by = %s
                   RETURNING q.id),
         started AS (UPDATE {table} AS q
                        SET attempts = CASE WHEN q.attempts < {max} THEN q.attempts + 1
                                            ELSE q.attempts END
                       FROM unnest(%s::uuid[], %s::bigint[]) AS s(id, claims)
                      WHERE q.id = s.id AND q.claims = s.claims AND q.reserved_by = %s
                     RETURNING q.id)
    SELECT ARRAY(SELECT id FROM acked), ARRAY(SELECT id FROM started){relax}"""


class PostgreSQLDialect(SQLDialect):
    """PostgreSQL 13+ (psycopg 3 for LISTEN and prepared per-job statements)."""

    NOW = "STATEMENT_TIMESTAMP()"
    marks_recovered = True
    NOW_US = "(EXTRACT(EPOCH FROM STATEMENT_TIMESTAMP()) * 1000000)::bigint"
    IN_SECONDS = "STATEMENT_TIMESTAMP() + MAKE_INTERVAL(secs => %s)"
    GREATEST = "GREATEST"

    def shifted_clock(self, seconds: float) -> tuple[str, str, str]:
        now = f"(STATEMENT_TIMESTAMP() + MAKE_INTERVAL(secs => {float(seconds)!r}))"
        return (now, f"(EXTRACT(EPOCH FROM {now}) * 1000000)::bigint",
                f"{now} + MAKE_INTERVAL(secs => %s)")

    def __init__(self, using: str) -> None:
        super().__init__(using)
        meta = QueuedJob._meta
        fields = meta.concrete_fields
        parts = {"table": meta.db_table, "now": self.NOW,
                 "paused": PausedQueue._meta.db_table}
        #: The push statements by form (one row, rows that share all but id and payload,
        #: any rows) and whether a NOTIFY rides along.
        self._push_sql = {
            (form, wake): template.format(
                **parts, notify_head=_NOTIFY_HEAD if wake else "",
                notify_tail=_NOTIFY_TAIL if wake else "")
            for form, template in (("one", _PUSH_ONE_SQL), ("shared", _PUSH_SHARED_SQL),
                                   ("any", _PUSH_SQL))
            for wake in (True, False)
        }
        #: The claim statement (``%(queue)s``, ``%(limit)s``, ``%(worker)s``, ``%(lease)s``
        #: and ``%(count)s``, 1 or 0 added to ``attempts``), for EXPLAIN in tests and diagnostics.
        # The dates the claim does not write (created_at, cancel_requested_at).
        dates = [f for f in fields if isinstance(f, DateTimeField)
                 and f.name not in ("available_at", "reserved_at")]
        returned = {
            "columns": ", ".join(_DATE_RETURNED.format(col=f"q.{f.column}") if f in dates
                                 else f"q.{f.column}" for f in fields),
            "unloadable": ", ".join(_DATE_UNLOADABLE.format(col=f"q.{f.column}", name=f.name)
                                    for f in dates)}
        self.claim_sql = _CLAIM_SQL.format(**parts, **returned, max=COUNTER_MAX)
        self.claim_statements = _IN_CLAIM_ORDER + self.claim_sql
        #: The fair claim (``fair_share.py``), uncapped (key False) and with a per-key cap.
        self.fair_claim_sql = {
            capped: _FAIR_CLAIM_SQL.format(
                **parts, **returned, max=COUNTER_MAX,
                **{name: _STEP.format(
                    **parts, after=after, upto=upto,
                    eligible=(_ELIGIBLE_CAPPED if capped else _ELIGIBLE).format(
                        **parts, key="x.k"))
                   for name, after, upto in (
                       ("step_after_cursor", " AND fair_key > %(ckey)s", ""),
                       ("step_after_a", " AND fair_key > a.k", ""),
                       ("step_first", "", _UPTO_CURSOR),
                       ("step_after_b", " AND fair_key > b.k", _UPTO_CURSOR))},
                eligible=(_ELIGIBLE_CAPPED if capped else _ELIGIBLE).format(**parts, key="s.k"),
                take=(f"LEAST({_TAKE}, %(per_key)s - "
                      f"{_RUNNING.format(**parts, key='keys.k')})" if capped else _TAKE))
            for capped in (False, True)}
        # The ack and start statements, each with a commit that waits for the disk (key
        # False) or not (True).
        def both(template: str) -> dict[bool, str]:
            return {relaxed: template.format(**parts, batch=Batch._meta.db_table, max=COUNTER_MAX,
                                             relax=_RELAX if relaxed else "")
                    for relaxed in (False, True)}

        self._ack_sql = both(_ACK_SQL)
        self._start_sql = both(_START_SQL)
        self._start_many_sql = both(_START_MANY_SQL)
        self._ack_and_start_sql = both(_ACK_AND_START_SQL)
        self._ack_counting_sql = both(_ACK_COUNTING_SQL)
        self._complete_sql = both(_COMPLETE_SQL)

    # -- queue -----------------------------------------------------------------------------

    def push(self, jobs: Sequence[NewJob], *, batch_size: int) -> None:
        wake = jobguard_settings.USE_NOTIFY
        if len(jobs) == 1:
            job = jobs[0]
            self._execute(self._push_sql["one", wake], [
                job.id, job.queue, job.name, job.payload, job.priority, job.at, job.delay,
                job.fair_key])
            return
        # Server-side binding (``_execute``): the arrays travel as parameters, not as
        # literals quoted in Python (which cost more than the rest of dispatch_many).
        for start in range(0, len(jobs), batch_size):
            batch = jobs[start:start + batch_size]
            ids, payloads = [job.id for job in batch], [job.payload for job in batch]
            queues, names = [job.queue for job in batch], [job.name for job in batch]
            priorities, ats = [job.priority for job in batch], [job.at for job in batch]
            delays, keys = [job.delay for job in batch], [job.fair_key for job in batch]
            shared = (queues, names, priorities, ats, delays, keys)
            # list.count compares in C (identity first): a few ns a row.
            if all(column.count(column[0]) == len(column) for column in shared):
                self._execute(self._push_sql["shared", wake],
                              [*(column[0] for column in shared), ids, payloads],
                              prepare=False, binary=True)
            else:
                self._execute(self._push_sql["any", wake],
                              [ids, queues, names, payloads, priorities, ats, delays, keys],
                              prepare=False, binary=True)

    def notify(self, queues: Iterable[str]) -> None:
        if not jobguard_settings.USE_NOTIFY:
            return
        with connections[self.using].cursor() as cursor:
            for queue in sorted(queues):
                cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue])

    def claim(self, queue: str, *, worker_id: str, limit: int, lease: float,
              count_attempts: bool = True, fair: FairClaim | None = None) -> list[QueuedJob]:
        # Rows are built straight from the cursor (no RawQuerySet): this runs once per job or
        # batch, and the ORM's per-query work was a third of a no-op job. Never prepared: its
        # best plan depends on how full the queue is, and a generic plan cached while the
        # queue was empty would seq-scan and sort a burst on every claim.
        params = {"queue": queue, "limit": limit, "worker": worker_id, "lease": lease,
                  "count": int(count_attempts)}
        # The lease ends ``lease`` s after the statement's clock, not before this time
        # (worker/completer.py: a start is deferred only while the lease surely holds).
        held_until = clock.lease_clock() + lease
        if fair is None and _claims_apart(connections[self.using]):
            fetched = _claim_connections.claim(self.using, self.claim_sql, params)
        elif fair is None:
            fetched = self._execute(self.claim_statements, params, fetch=True, rows=True,
                                    statements=True)
        else:  # never prepared either: a generic plan made on an empty queue seq-scans
            # for every key it walks (tests/unit/dialects/test_claim_plan.py)
            weights = sorted(fair.weights.items())
            params.update(ckey=fair.cursor.key, cused=fair.cursor.used, keys=limit,
                          per_key=fair.per_key, wkeys=[k for k, _ in weights],
                          wvals=[w for _, w in weights])
            fetched = sorted(self._execute(self.fair_claim_sql[fair.per_key is not None],
                                           params, fetch=True, prepare=False, rows=True),
                             key=lambda values: values[-1])
            # The fair claim does not tell recovered rows apart: None (their starts are
            # written as they start, worker/completer.py).
            fetched = [(*values[:-1], None) for values in fetched]
        rows = []
        plain = plain_rows()
        for values in fetched:
            row = job_from_values(self.using, list(values[:-2]),
                                  [values[-2]] if values[-2] else (), plain=plain)
            row.recovered = values[-1]
            row.held_until = held_until
            rows.append(row)
        return rows

    def ack(self, job_id: Any, reserved_by: str, claims: int, *, relaxed: bool = False) -> bool:
        ((acked, *_),) = self._execute(self._ack_sql[relaxed], [job_id, reserved_by, claims],
                                       fetch=True)
        return acked > 0

    def start(self, job_id: Any, reserved_by: str, claims: int, *,
              relaxed: bool = False) -> bool:
        ((started, *_),) = self._execute(self._start_sql[relaxed],
                                         [job_id, reserved_by, claims], fetch=True)
        return started > 0

    def start_many(self, starts: Sequence[tuple[Any, int]], reserved_by: str, *,
                   relaxed: bool = False) -> set[Any]:
        ((started, *_),) = self._execute(self._start_many_sql[relaxed],
                                         [*_array_literals(starts), reserved_by], fetch=True)
        return set(started)

    def ack_and_start(self, job_id: Any, reserved_by: str, claims: int, start_id: Any,
                      start_claims: int, *, relaxed: bool = False) -> tuple[bool, bool]:
        ((acked, started, *_),) = self._execute(
            self._ack_and_start_sql[relaxed],
            [job_id, reserved_by, claims, start_id, reserved_by, start_claims], fetch=True)
        return acked > 0, started > 0

    def ack_counting(self, job_id: Any, reserved_by: str, claims: int, start_id: Any,
                     start_claims: int | None, batch_id: Any, *,
                     relaxed: bool = False) -> tuple[bool, bool, tuple[int, int] | None]:
        ((acked, started, pending, failed, *_),) = self._execute(
            self._ack_counting_sql[relaxed],
            [job_id, reserved_by, claims, start_id, reserved_by, start_claims, batch_id],
            fetch=True)
        if acked and pending is None:  # no such batch, or nothing was pending
            return True, started > 0, self.count_batch_success(batch_id)
        return acked > 0, started > 0, (pending, failed) if acked else None

    def notify_result(self, job_id: Any) -> None:
        if not jobguard_settings.USE_NOTIFY:
            return
        with connections[self.using].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [RESULT_CHANNEL, str(job_id)])

    def listen_results(self, via: str | None = None) -> ResultListener | None:
        if psycopg is None or not jobguard_settings.USE_NOTIFY:
            return None
        params = _session_params(via or self.using)
        key = repr(sorted(params.items()))
        conn = _idle_result_connections.take(key)
        if conn is not None:
            try:
                conn.execute(f"LISTEN {RESULT_CHANNEL}")
                return PostgreSQLResultListener(conn, key)
            except Exception:  # gone while it was kept: a new one
                _close_quietly(conn)
        conn = psycopg.connect(**params, autocommit=True)
        try:
            conn.execute(f"LISTEN {RESULT_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return PostgreSQLResultListener(conn, key)

    def listen(self, via: str | None = None) -> Listener | None:
        if psycopg is None:
            return None
        alias = via or self.using
        conn = psycopg.connect(**_session_params(alias), autocommit=True)
        try:
            if not self._hears_notify(conn):
                raise ListenUnavailable(
                    f"A NOTIFY sent to database {self.using!r} did not reach a LISTEN on "
                    f"database {alias!r} within {PROBE_SECONDS:g} s: is {alias!r} behind a "
                    f"PgBouncer in transaction pooling mode? Set JOBGUARD['LISTEN_DATABASE'] "
                    f"to an alias with a direct connection to the same database "
                    f"(docs/databases.md#pgbouncer).")
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return PostgreSQLListener(conn)

    def _hears_notify(self, conn: Any) -> bool:
        """Whether a NOTIFY sent the way dispatch sends one (on a connection to this dialect's
        database) reaches a LISTEN on ``conn``, on a channel of its own.

        Through a transaction-pooling PgBouncer it does not: the server connection that ran
        the LISTEN went back to the pool, and PgBouncer drops what it hears. Nor when
        ``LISTEN_DATABASE`` is another database than the queue's."""
        channel = f"{NOTIFY_CHANNEL}_probe_{uuid.uuid4().hex}"
        conn.execute(f"LISTEN {channel}")
        try:
            with psycopg.connect(**_session_params(self.using), autocommit=True) as sender:
                sender.execute("SELECT pg_notify(%s, '')", [channel])
            return any(note.channel == channel
                       for note in conn.notifies(timeout=PROBE_SECONDS, stop_after=1))
        finally:
            conn.execute(f"UNLISTEN {channel}")

    def complete(self, done: Sequence[tuple[Any, int]], starts: Sequence[tuple[Any, int]],
                 reserved_by: str, *, relaxed: bool = False) -> tuple[set[Any], set[Any]]:
        ((acked, started, *_),) = self._execute(self._complete_sql[relaxed], [
            *_array_literals(done), reserved_by, *_array_literals(starts), reserved_by],
            fetch=True)
        return set(acked), set(started)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any], *,
                prepare: bool | None = None) -> Any:
        """Run one of jobguard's own statements the way the per-job path does (see
        :meth:`_execute`): the history's flush of many runs, one array per column."""
        return self._execute(sql, params, prepare=prepare)

    def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any], *,
                 fetch: bool = False, prepare: bool | None = None, binary: bool = False,
                 rows: bool = False, statements: bool = False) -> Any:
        """Run a statement of the per-job path (push of one job, claim, ack).

        With psycopg 3 it goes through a server-binding cursor on Django's connection, so
        when the database ``OPTIONS`` set ``prepare_threshold`` (Django turns prepared
        statements off by default, for connection poolers) the statement is prepared once per
        connection instead of parsed and planned per job (``prepare=False`` opts a statement
        out). Errors still surface as Django's ``DatabaseError``; with queries logged (DEBUG,
        tests) it takes Django's cursor so they are seen. Returns the rows, or the row count.
        ``binary``: the parameters travel in PostgreSQL's binary format (arrays of many
        values: no quoting of each element in Python). ``rows``: it returns whole job rows
        (the claim), whose times load through psycopg's own loader (see :func:`_fast_times`).
        ``statements``: ``sql`` is several statements, sent as one query string (bound on the
        client, never prepared); what the last one returns.
        """
        wrapper = connections[self.using]
        if psycopg is None or wrapper.queries_logged:
            if psycopg is not None and statements:  # logged, whatever the cursor Django uses
                wrapper.ensure_connection()
                logged = wrapper.make_debug_cursor(psycopg.ClientCursor(wrapper.connection))
            else:
                logged = wrapper.cursor()
            with logged as cursor:
                cursor.execute(sql, params)
                if statements:
                    _to_last_result(cursor)
                return cursor.fetchall() if fetch else cursor.rowcount
        wrapper.ensure_connection()
        make = psycopg.ClientCursor if statements else psycopg.Cursor
        with wrapper.wrap_database_errors, make(wrapper.connection) as cursor:
            if binary:  # psycopg's placeholder for a parameter sent in binary
                sql = sql.replace("%s", "%b")
            if rows and _fast_times(wrapper):
                cursor.adapters.register_loader("timestamptz", _TIMESTAMPTZ_LOADER)
            cursor.execute(sql, params, prepare=False if statements else prepare)
            if statements:
                _to_last_result(cursor)
            return cursor.fetchall() if fetch else cursor.rowcount

    def estimate_rows(self, rows: Any) -> int | None:
        """``EXPLAIN``'s row estimate: the planner's statistics, as fresh as the last
        ``ANALYZE`` (autovacuum runs it as the table changes)."""
        sql, params = rows.values_list("pk").query.sql_with_params()
        with connections[self.using].cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        return int(plan[0]["Plan"]["Plan Rows"])


def _to_last_result(cursor: Any) -> None:
    """Move ``cursor`` past the results of the statements before the last one of a query
    string (psycopg 3 starts at the first; psycopg 2 keeps only the last)."""
    while cursor.description is None and cursor.nextset():
        pass


def _array_literals(pairs: Sequence[tuple[Any, int]]) -> tuple[str, str]:
    """Ids and claim counts as two array literals (``{a,b}``): one text parameter each,
    which PostgreSQL parses, instead of psycopg dumping every element in Python (a third
    of a completion group's cost in the worker)."""
    return ("{" + ",".join([str(job_id) for job_id, _ in pairs]) + "}",
            "{" + ",".join([str(claims) for _, claims in pairs]) + "}")


def _session_params(alias: str) -> dict[str, Any]:
    """psycopg connection parameters of ``alias`` for a plain autocommit connection of ours
    (no Django cursor classes, no prepared statements)."""
    params = connections[alias].get_connection_params()
    for option in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(option, None)
    return params


def _claims_apart(wrapper: Any) -> bool:
    """Whether this thread's claims of the alias of ``wrapper`` go through a connection of
    their own (:class:`ClaimConnections`): with psycopg 3, where the alias's ``OPTIONS``
    allow prepared statements (``prepare_threshold``), no transaction-pooling PgBouncer is
    declared in between and no Django pool (``OPTIONS["pool"]``) hands out its connections
    (their session settings would reach other clients); and not inside a transaction (whose
    rows only its own connection sees, such as a concurrency cap's gate) nor while queries
    are logged (``DEBUG``, a test's capture)."""
    options = wrapper.settings_dict.get("OPTIONS") or {}
    return (psycopg is not None and not wrapper.in_atomic_block and not wrapper.queries_logged
            and options.get("prepare_threshold") is not None and not options.get("pool")
            and not pooling.behind_pgbouncer(wrapper.alias))


class ClaimConnections:
    """Each thread's connection for its plain claims, per database alias: a second Django
    connection of the alias (its settings, time zone and adapters) whose session never sorts
    (``enable_sort`` and ``jit`` off), so that the claim is a prepared statement whose plan,
    custom or generic, reads ``jobguard_claim_idx`` in order whatever the statistics (see
    :data:`_IN_CLAIM_ORDER`). On Django's own connection the claim cannot be prepared: the
    ``SET LOCAL`` before it needs the simple query protocol, which parses and plans every
    claim anew (half of PostgreSQL's CPU of a claim on a 2-core machine,
    docs/benchmarks.md). Nothing else runs on it. A claim that fails closes it (the next
    opens another); :meth:`close` closes this thread's, :meth:`close_all` every one (at
    the end of a test: an open session would keep the test database from being dropped)."""

    #: Applied once per connection, for its whole session.
    SESSION = "SELECT set_config('enable_sort', 'off', false), set_config('jit', 'off', false)"

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        #: Counted up by :meth:`close_all`: a thread's wrappers of an earlier generation are
        #: made again (a test may have changed the settings they were made from).
        self._generation = 0

    def claim(self, alias: str, sql: str, params: dict[str, Any]) -> list[Any]:
        """Run the claim ``sql`` on this thread's claim connection of ``alias``: its rows."""
        wrapper = self._wrapper(alias)
        try:
            with wrapper.wrap_database_errors:
                if wrapper.connection is None:
                    with self._lock:  # (again after a close_all())
                        if all(w is not wrapper for w in self._all):
                            self._all.append(wrapper)
                    wrapper.ensure_connection()
                    wrapper.connection.execute(self.SESSION)
                with psycopg.Cursor(wrapper.connection) as cursor:
                    if _fast_times(wrapper):
                        cursor.adapters.register_loader("timestamptz", _TIMESTAMPTZ_LOADER)
                    cursor.execute(sql, params, prepare=True)
                    return cursor.fetchall()
        except BaseException:
            _close_raw(wrapper)  # whatever broke (an error, a stop raised in): a fresh one next
            raise

    def _wrapper(self, alias: str) -> Any:
        local = vars(self._local)
        if local.get("generation") != self._generation:
            local["generation"], local["wrappers"] = self._generation, {}
        kept = local.setdefault("wrappers", {})  # (none after this thread's close())
        wrapper = kept.get(alias)
        if wrapper is None:
            wrapper = kept[alias] = connections.create_connection(alias)
        return wrapper

    def close(self) -> None:
        """Close this thread's claim connections (a thread that ends)."""
        mine = list(vars(self._local).pop("wrappers", {}).values())
        with self._lock:
            self._all = [w for w in self._all if all(w is not m for m in mine)]
        for wrapper in mine:
            _close_raw(wrapper)

    def close_all(self) -> None:
        """Close every thread's (when none of them claims any more)."""
        with self._lock:
            wrappers, self._all = self._all, []
            self._generation += 1
        for wrapper in wrappers:
            _close_raw(wrapper)


def _close_raw(wrapper: Any) -> None:
    """Close the psycopg connection of a claim connection's wrapper from any thread (Django's
    ``close()`` refuses a wrapper of another thread); the next claim opens another."""
    conn, wrapper.connection = wrapper.connection, None
    if conn is not None:
        _close_quietly(conn)


_claim_connections = ClaimConnections()


def close_claim_connections(*, every_thread: bool = False) -> None:
    """Close this thread's claim connections (:class:`ClaimConnections`), or with
    ``every_thread`` every thread's (at the end of a test)."""
    if every_thread:
        _claim_connections.close_all()
    else:
        _claim_connections.close()


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


class IdleConnections:
    """The connections of closed result listeners, kept (without their LISTEN) for the next
    ``wait()``: a new connection costs several milliseconds (14 ms at the median on a loaded
    2-core machine, docs/benchmarks.md), mostly while the job it waits for is ending, and a
    LISTEN one round trip. At most :data:`KEPT` per set of connection parameters, each closed
    once unused for :data:`MAX_IDLE` seconds (when the next listener is taken or put back),
    or by :meth:`close_all` (the pytest plugin's, after each test: an open session would keep
    the test database from being dropped)."""

    KEPT = 4
    MAX_IDLE = 60.0

    def __init__(self) -> None:
        self._kept: dict[str, list[tuple[Any, float]]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def take(self, key: str) -> Any | None:
        """A kept connection for ``key``, the most recently used, or ``None``."""
        stale = self._expire()
        with self._lock:
            kept = self._kept.get(key)
            conn = kept.pop()[0] if kept else None
        for old in stale:
            _close_quietly(old)
        return conn

    def put(self, key: str, conn: Any) -> None:
        """Keep ``conn`` (its LISTEN ended, nothing pending) or close it when enough are."""
        stale = self._expire()
        with self._lock:
            kept = self._kept.setdefault(key, [])
            if len(kept) < self.KEPT:
                kept.append((conn, time.monotonic()))
                conn = None
        for old in stale if conn is None else [*stale, conn]:
            _close_quietly(old)

    def close_all(self) -> None:
        stale = self._expire()  # after a fork, forgets the parent's first
        with self._lock:
            kept, self._kept = self._kept, {}
        for conn in [*stale, *(conn for conns in kept.values() for conn, _ in conns)]:
            _close_quietly(conn)

    def _expire(self) -> list[Any]:
        horizon = time.monotonic() - self.MAX_IDLE
        stale: list[Any] = []
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's, neither used nor closed
                self._kept, self._pid = {}, os.getpid()
            for key, kept in self._kept.items():
                stale += [conn for conn, since in kept if since < horizon]
                self._kept[key] = [(conn, since) for conn, since in kept if since >= horizon]
        return stale


_idle_result_connections = IdleConnections()


def close_idle_result_connections() -> None:
    """Close the connections kept for the next ``wait()`` (see :class:`IdleConnections`)."""
    _idle_result_connections.close_all()


class PostgreSQLResultListener(ResultListener):
    """LISTEN for written results on an autocommit connection of its own; :meth:`close`
    ends the LISTEN and keeps the connection for the next listener (:class:`IdleConnections`)."""

    def __init__(self, raw_connection: Any, key: str = "") -> None:
        self._conn = raw_connection
        self._key = key

    def wait(self, timeout: float) -> set[str]:
        heard = {note.payload for note in self._conn.notifies(timeout=timeout, stop_after=1)}
        if heard:
            heard |= {note.payload for note in self._conn.notifies(timeout=0)}
        return heard

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(f"UNLISTEN {RESULT_CHANNEL}")  # kept idle, it must hear nothing
            for _ in conn.notifies(timeout=0):  # what came before the UNLISTEN
                pass
            reusable = bool(self._key) and (
                conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
        except Exception:
            reusable = False
        if reusable:
            _idle_result_connections.put(self._key, conn)
        else:
            _close_quietly(conn)


class PostgreSQLListener(Listener):
    """LISTEN on its own autocommit connection (never the thread's Django connection)."""

    def __init__(self, raw_connection: Any) -> None:
        self._conn = raw_connection

    def wait(self, timeout: float) -> bool:
        woke = False
        for _ in self._conn.notifies(timeout=timeout, stop_after=1):
            woke = True
        if woke:  # drain the rest so the next wait blocks again
            for _ in self._conn.notifies(timeout=0):
                pass
        return woke

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:
            pass
