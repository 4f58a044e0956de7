"""Run by the debounce storm test: ``python -m tests.support.debounce_script THREADS N GO``.

Sets Django up (database from the environment, see ``tests.support.worker_env``), prints
``ready``, waits until the file ``GO`` exists so that every process starts at once, then
``THREADS`` threads each dispatch ``DebouncedRecord("storm", "<pid>-<thread>-<i>")`` N times
(debounce 30 s, so no worker takes the row meanwhile), and prints one JSON line: how many
dispatches inserted a row, how many folded, and the ids they were given.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


def main() -> None:
    threads, count, go_file = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    import django

    django.setup()
    from django.db import connection

    from tests.support.long_jobs import DebouncedRecord

    connection.ensure_connection()
    print("ready", flush=True)
    while not go_file.exists():
        time.sleep(0.001)
    inserted, folded, ids, errors = [0], [0], set(), []
    lock = threading.Lock()

    def run(thread: int) -> None:
        from django.db import connections

        try:
            for i in range(count):
                result = DebouncedRecord("storm", f"{os.getpid()}-{thread}-{i}").dispatch(
                    debounce=(30, 600))
                with lock:
                    ids.add(result.id)
                    if result.folded:
                        folded[0] += 1
                    else:
                        inserted[0] += 1
        except Exception as exc:  # reported, and the test fails on it
            errors.append(repr(exc))
        finally:
            connections.close_all()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"inserted": inserted[0], "folded": folded[0], "ids": sorted(ids),
                      "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
