"""The entry point of a ``jobworker --concurrency`` child process.

The supervisor starts children with ``spawn``: each child imports this module before Django
is set up, so it imports nothing from Django (or from modules that need the app registry)
until :func:`main` has called ``django.setup()``.
"""

from __future__ import annotations

import sys
from typing import Any


def main(options: dict[str, Any], verbosity: int, finished: Any = None,
         log_format: str | None = None, metrics: bool = False) -> None:
    """Run one worker; ``finished`` (a shared flag) is set only when the worker itself
    returned, so the supervisor can tell that from a child ended by its job's code
    (``os._exit(0)``). Its job lines go to stdout as the supervisor's command shows them
    (``log_format``); ``metrics``: record them for the supervisor's ``--metrics-port``."""
    import django

    django.setup()
    from django_jobguard import logs
    from django_jobguard.worker.loop import WorkerOptions, run_worker_process

    logs.install_handler(verbosity, log_format)
    if metrics:
        from django_jobguard.metrics.recording import start_recording

        start_recording()

    code = run_worker_process(WorkerOptions(**options), verbosity=verbosity, own_process=True)
    if finished is not None:
        finished.value = 1
    sys.exit(code)
