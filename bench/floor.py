"""The raw-SQL floor: the least work a PostgreSQL queue can do per job, with plain psycopg.

``python -m bench.floor --batch 1`` claims rows of ``bench_floor`` (a copy of jobguard's queue
table, same indexes) with the same ``UPDATE … FOR UPDATE SKIP LOCKED … RETURNING`` statement,
then deletes each by id (its commit not waiting for the disk, as jobguard's default ack),
until killed. No Django, no job classes, no logging, no heartbeat.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

import psycopg

TABLE = "bench_floor"
CREATE = f"CREATE TABLE IF NOT EXISTS {TABLE} (LIKE django_jobguard_queuedjob INCLUDING ALL)"
INSERT = (f"INSERT INTO {TABLE} (id, queue, name, payload, attempts, exceptions, priority, "
          f"reserved_by, last_error) VALUES (%s, 'bench', 'bench.Noop', %s, 0, 0, 0, '', '')")
CLAIM = f"""
    WITH picked AS MATERIALIZED (
        SELECT id FROM {TABLE}
         WHERE queue = 'bench' AND available_at <= statement_timestamp()
         ORDER BY priority DESC, available_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    UPDATE {TABLE} AS q SET attempts = q.attempts + 1, reserved_at = statement_timestamp(),
           reserved_by = %(worker)s, available_at = statement_timestamp() + interval '90 seconds'
      FROM picked WHERE q.id = picked.id
    RETURNING q.id, q.name, q.payload"""
# With the durability of jobguard's default ack (SYNCHRONOUS_ACKS False): the commit does not
# wait for the WAL flush. The floor stays the least a queue with the same guarantees can do.
DELETE = f"""
    WITH acked AS (DELETE FROM {TABLE} WHERE id = %s AND reserved_by = %s RETURNING 1)
    SELECT (SELECT count(*) FROM acked), set_config('synchronous_commit', 'off', true)"""
PAYLOAD = json.dumps({"args": [], "kwargs": {}})


# The INSERT and a NOTIFY in one autocommit statement (one round trip, as jobguard sends it).
INSERT_NOTIFY = (f"WITH inserted AS ({INSERT} RETURNING queue) "
                 f"SELECT pg_notify('bench_floor', queue) FROM inserted")


def insert_single(conn: psycopg.Connection, n: int, *, notify: bool = False) -> None:
    """One autocommit INSERT per job (what a view dispatching one job does); with ``notify``
    also a NOTIFY, as a queue that wakes its idle workers sends."""
    sql = INSERT_NOTIFY if notify else INSERT
    for _ in range(n):
        conn.execute(sql, [uuid.uuid4(), PAYLOAD])


def insert_bulk(conn: psycopg.Connection, n: int, batch: int = 500) -> None:
    """Multi-row INSERTs of ``batch`` rows, in one transaction."""
    values = "(%s, 'bench', 'bench.Noop', %s, 0, 0, 0, '', '')"
    head = INSERT.split(" VALUES ")[0]
    with conn.transaction():
        for start in range(0, n, batch):
            size = min(batch, n - start)
            params = []
            for _ in range(size):
                params += [uuid.uuid4(), PAYLOAD]
            conn.execute(f"{head} VALUES {', '.join([values] * size)}", params)


def work(url: str, batch: int) -> None:
    worker_id = f"floor:{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            # not prepared, like jobguard's: a generic plan cached while the table was empty
            # re-runs the pick for every row of a burst (that stalled the floor for minutes)
            rows = conn.execute(CLAIM, {"worker": worker_id, "limit": batch},
                                prepare=False).fetchall()
            if not rows:
                time.sleep(0.002)
                continue
            for job_id, _name, _payload in rows:
                conn.execute(DELETE, [job_id, worker_id])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--conninfo", required=True, help="libpq connection string")
    args = parser.parse_args()
    work(args.conninfo, args.batch)
