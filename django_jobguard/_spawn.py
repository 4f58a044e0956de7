"""Entry point of a ``--concurrency`` child; imports nothing from Django before setup()."""

from __future__ import annotations

import sys
from typing import Any


def child_main(options: dict[str, Any], verbosity: int) -> None:
    import django

    django.setup()
    from django_jobguard.management.commands.jobworker import run_worker_process
    from django_jobguard.worker import WorkerOptions

    sys.exit(run_worker_process(WorkerOptions(**options), verbosity=verbosity))
