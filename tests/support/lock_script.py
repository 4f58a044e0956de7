"""Run by the multi-process lock tests: ``python -m tests.support.lock_script MODE N GO_FILE``.

The process sets Django up (the test database and store come from the environment, see
``tests.support.worker_env``), prints ``ready``, waits until ``GO_FILE`` exists so that every
process starts at once, does its work and prints one JSON line with what happened.

- ``dispatch``: dispatch ``UniqueRecord("storm")`` N times.
- ``rollback``: N times, dispatch ``UniqueRecord("storm")`` in a transaction, rolled back
  for the first half of the dispatches that were queued, committed after; counts both.
- ``fence``: N times, take the lock ``jobguard:overlap:fence`` (retrying until free), note
  the fencing token, release it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    mode, count, go_file = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    import django

    django.setup()
    from django_jobguard.stores import get_store
    from tests.support.lock_jobs import UniqueRecord

    store = get_store()
    store.now()  # connect before the start line
    print("ready", flush=True)
    while not go_file.exists():
        time.sleep(0.001)
    if mode == "dispatch":
        results = [bool(UniqueRecord("storm", label="storm").dispatch()) for _ in range(count)]
        print(json.dumps({"queued": sum(results), "skipped": results.count(False)}), flush=True)
    elif mode == "rollback":
        from django.db import OperationalError, transaction

        class RolledBack(Exception):
            pass

        committed = rolled_back = deadlocks = 0
        for _ in range(count):
            try:
                with transaction.atomic():
                    queued = bool(UniqueRecord("storm", label="storm").dispatch())
                    time.sleep(0.002)  # hold the transaction open: others probe meanwhile
                    if queued and rolled_back < count // 2:
                        raise RolledBack
                committed += queued
            except RolledBack:
                rolled_back += 1
            except OperationalError as exc:  # InnoDB aborted the transaction: an app retries
                if "Deadlock" not in str(exc):
                    raise
                deadlocks += 1
        # A process that met the others' open transactions too often never reached its
        # commits: it goes on until a dispatch of the storm is committed (by it or another).
        from django_jobguard.models import QueuedJob

        deadline = time.monotonic() + 60
        while not committed and time.monotonic() < deadline and not QueuedJob.objects.exists():
            try:
                with transaction.atomic():
                    committed += bool(UniqueRecord("storm", label="storm").dispatch())
            except OperationalError as exc:
                if "Deadlock" not in str(exc):
                    raise
                deadlocks += 1
        print(json.dumps({"committed": committed, "rolled_back": rolled_back,
                          "deadlocks": deadlocks}), flush=True)
    elif mode == "fence":
        tokens = []
        for n in range(count):
            owner = f"{os.getpid()}:{n}"
            while (token := store.acquire("jobguard:overlap:fence", owner, ttl=30)) is None:
                pass
            tokens.append(token)
            assert store.release("jobguard:overlap:fence", owner)
        print(json.dumps({"tokens": tokens}), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
