"""What the tests (and bench/) share: real worker processes, in-process helpers, and the job
modules the test settings load (``tests.support.jobs`` and friends).

Names are imported lazily, so that a script run as ``python -m tests.support.lock_script``
can import this package before it sets Django up.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    **dict.fromkeys(["MANAGE", "POSTGRES", "REDIS_URL", "ROOT", "WorkerPool", "ran_at_once",
                     "requires_postgres", "requires_redis", "run_command", "start_workers",
                     "worker_env"], "tests.support.processes"),
    **dict.fromkeys(["expire", "make_due", "work"], "tests.support.inprocess"),
    **dict.fromkeys(["WaitTimeout", "wait_for"], "tests.support.waiting"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tests.support' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
