"""The entry point of a ``jobworker --concurrency`` child process.

The supervisor starts children with ``spawn``: each child imports this module before Django
is set up, so it imports nothing from Django (or from modules that need the app registry)
until :func:`main` has called ``django.setup()``.
"""

from __future__ import annotations

import sys
from typing import Any


def main(options: dict[str, Any], verbosity: int, finished: Any = None) -> None:
    """Run one worker; ``finished`` (a shared flag) is set only when the worker itself
    returned, so the supervisor can tell that from a child ended by its job's code
    (``os._exit(0)``)."""
    import django

    django.setup()
    from django_jobguard.worker import WorkerOptions, run_worker_process

    code = run_worker_process(WorkerOptions(**options), verbosity=verbosity)
    if finished is not None:
        finished.value = 1
    sys.exit(code)
