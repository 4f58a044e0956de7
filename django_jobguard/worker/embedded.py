"""``JOBGUARD["EMBEDDED_WORKER"]``: worker threads inside the web server's process.

For small apps and development (GoodJob's async mode): no ``jobworker`` to deploy. The
threads start in a process that serves requests, at its first request through Django's
WSGI or ASGI handler (``runserver``, gunicorn, uvicorn, ...), or at once where the project
calls :func:`start` in its ``wsgi.py``/``asgi.py``. They never start in ``migrate``,
``shell`` or other commands (no request), nor in tests (the test client's handler is not a
server's, and a live server runs under the test environment). Each thread is a
:class:`~django_jobguard.worker.Worker` with its own database connection; at interpreter exit
(the server's graceful shutdown) they stop claiming, finish the running job within
``shutdown_timeout`` seconds and give back what they claimed ahead.

Jobs run in threads, so a job's ``timeout`` is not enforced (``SIGALRM`` works in the main
thread only) and the ``--memory`` limit does not apply: use ``jobworker`` for those.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_jobguard.conf import jobguard_settings

if TYPE_CHECKING:
    from django_jobguard.worker.loop import Worker

logger = logging.getLogger("django_jobguard.embedded")

#: The keys of ``EMBEDDED_WORKER`` and their defaults.
DEFAULTS: dict[str, Any] = {"threads": 1, "queues": None, "sleep": 3.0,
                            "shutdown_timeout": 20.0, "tries": 1}


@dataclass
class EmbeddedWorkers:
    """The worker threads of one process (the settings' keys: see :data:`DEFAULTS`)."""

    threads: int
    queues: list[str]
    sleep: float
    shutdown_timeout: float
    tries: int
    workers: list[Worker] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def from_settings(cls) -> EmbeddedWorkers:
        config = {**DEFAULTS, **(jobguard_settings.EMBEDDED_WORKER or {})}
        queues = config.pop("queues") or [jobguard_settings.DEFAULT_QUEUE]
        return cls(queues=list(queues), **config)

    def start(self) -> None:
        from django_jobguard.worker.loop import Worker, WorkerOptions  # needs the app registry

        for number in range(self.threads):
            # memory=0: the limit exits a worker process; this one is the web server's.
            worker = Worker(WorkerOptions(queues=self.queues, sleep=self.sleep, memory=0,
                                          tries=self.tries))
            thread = threading.Thread(target=_run, args=(worker,), daemon=True,
                                      name=f"jobguard-embedded-{number + 1}")
            self.workers.append(worker)
            self._threads.append(thread)
            thread.start()
        logger.info("Started %s embedded worker thread(s) on %s in pid %s.", self.threads,
                    ",".join(self.queues), os.getpid())

    def stop(self, timeout: float | None = None) -> bool:
        """Ask every thread to stop after its job and wait up to ``timeout`` seconds
        (``shutdown_timeout``); ``False`` if one was still running a job then (its row comes
        back to the queue when its lease runs out)."""
        if timeout is None:
            timeout = self.shutdown_timeout
        for worker in self.workers:
            worker.stop()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        running = [t.name for t in self._threads if t.is_alive()]
        if running:
            logger.warning("Embedded worker thread(s) %s still running a job after %g s; its "
                           "lease brings it back to the queue.", ", ".join(running), timeout)
        return not running


def _run(worker: Worker) -> None:
    try:
        worker.run()
    except Exception:
        logger.exception("Embedded worker %s stopped with an error.", worker.id)
    finally:
        connections.close_all()  # this thread's connections


_lock = threading.Lock()
_running: tuple[int, EmbeddedWorkers] | None = None  # (pid, workers) of this process


def in_tests() -> bool:
    """Whether Django's test environment is set up (``setup_test_environment``: Django's
    runner and pytest-django), where embedded workers never start."""
    from django.core import mail

    return hasattr(mail, "outbox")


def start() -> EmbeddedWorkers | None:
    """Start this process's embedded workers if ``EMBEDDED_WORKER`` is set; once per process
    (a forked process starts its own); ``None`` when off or in tests. This module imports
    nothing that needs the app registry, so a ``wsgi.py`` may import it first."""
    global _running
    if not jobguard_settings.EMBEDDED_WORKER or in_tests():
        return None
    with _lock:
        if _running is not None and _running[0] == os.getpid():
            return _running[1]
        workers = EmbeddedWorkers.from_settings()
        workers.start()
        _running = (os.getpid(), workers)
        atexit.register(workers.stop)  # runs before daemon threads are ended
        return workers


def stop(timeout: float | None = None) -> bool:
    """Stop this process's embedded workers (the server's shutdown does it at exit)."""
    global _running
    with _lock:
        running, _running = _running, None
    if running is None or running[0] != os.getpid():
        return True
    atexit.unregister(running[1].stop)
    return running[1].stop(timeout)


def on_request_started(sender: Any, **kwargs: Any) -> None:
    """``request_started`` receiver: the first request a server handles starts the workers
    (the test client's handler is not a server's)."""
    if _running is not None and _running[0] == os.getpid():
        return
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.wsgi import WSGIHandler

    if isinstance(sender, type) and issubclass(sender, (WSGIHandler, ASGIHandler)):
        start()
