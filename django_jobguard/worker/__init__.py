"""The worker runtime: ``manage.py jobworker``'s loop and everything it runs on.

One package for the runtime (Oban's ``queues/``, celery's ``concurrency/``): the loop
(:mod:`.loop`), its heartbeat (:mod:`.heartbeat`), one job's route (:mod:`.pipeline`), the
executors that run claimed rows on threads (:mod:`.executor`) or on the event loop
(:mod:`.async_executor`), claiming (:mod:`.claiming`, :mod:`.queue_selection`), time limits
(:mod:`.timeouts`, :mod:`.watchdog`), and the processes around a worker (:mod:`.supervisor`,
:mod:`.child_process`, :mod:`.reloader`, :mod:`.embedded`).

The public names are imported lazily, so that a ``--concurrency`` child process (spawned,
before ``django.setup()``) can import :mod:`.child_process` without the app registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_jobguard.worker.loop import (
        EXIT_MEMORY,
        EXIT_OK,
        RecentOutcomes,
        StopFlag,
        Worker,
        WorkerOptions,
        make_worker,
        run_worker,
        run_worker_process,
    )

__all__ = ["EXIT_MEMORY", "EXIT_OK", "RecentOutcomes", "StopFlag", "Worker", "WorkerOptions",
           "make_worker", "run_worker", "run_worker_process"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("django_jobguard.worker.loop"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
