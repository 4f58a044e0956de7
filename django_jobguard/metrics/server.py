"""``jobworker --metrics-port``: serve a worker's own metrics over HTTP.

One process: ``prometheus_client``'s server on the default registry, which the worker
records into. ``--concurrency`` children are separate processes, so the supervisor makes a
directory for ``prometheus_client``'s multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set
before the children start so they write their counters there), serves the sum of all
children's files on one port, marks a child dead when it exits and removes the directory
when it stops. A child replaced after a crash keeps its predecessors' counts (their files
stay), so totals never go back while the supervisor runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from django_jobguard.metrics import require

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class MetricsServer:
    """The HTTP server of ``--metrics-port`` (:meth:`close` stops it and cleans up)."""

    def __init__(self, port: int, addr: str = "127.0.0.1", *,
                 multiprocess: bool = False) -> None:
        require()
        self.directory: str | None = None
        self._previous_env = os.environ.get(MULTIPROC_ENV)
        if multiprocess:
            self.directory = tempfile.mkdtemp(prefix="jobguard-metrics-")
            os.environ[MULTIPROC_ENV] = self.directory  # inherited by the children
            from prometheus_client import CollectorRegistry
            from prometheus_client.multiprocess import MultiProcessCollector

            registry: Any = CollectorRegistry()
            MultiProcessCollector(registry, path=self.directory)
        else:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        from prometheus_client import start_http_server

        try:
            self.server, self.thread = start_http_server(port, addr=addr, registry=registry)
        except OSError:
            self._clean_up()
            raise
        self.port = self.server.server_port

    def child_exited(self, pid: int) -> None:
        """Drop the live-gauge files of a child that exited (its counters stay)."""
        if self.directory is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, self.directory)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._clean_up()

    def _clean_up(self) -> None:
        if self.directory is None:
            return
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._previous_env is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = self._previous_env
        self.directory = None
