"""What the pipeline tells the outside about each job: one call per job line, passed on to
``logging`` (:mod:`~django_jobguard.logs`), the metrics recorders (``jobworker
--metrics-port``, :mod:`django_jobguard.metrics`) and the run's trace span
(:mod:`~django_jobguard.tracing`); and the span around one row's processing.

Nothing here needs ``prometheus_client`` or OpenTelemetry: recorders register themselves,
and tracing is a no-op without its package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from django_jobguard import logs, tracing
from django_jobguard.outcome import JobState

#: ``recorder(row, state, elapsed)`` for each finished job line (not RUNNING).
Recorder = Callable[[Any, str, "float | None"], None]
_recorders: list[Recorder] = []
#: ``run_recorder(worker_id, row, state, elapsed, detail)`` for each finished job line: the
#: finished-job history (:class:`django_jobguard.history.RunRecorder`), installed only when
#: ``JOBGUARD["HISTORY"]`` is not "off".
RunRecorder = Callable[[str, Any, str, "float | None", str], None]
_run_recorders: list[RunRecorder] = []

_NO_SPAN = contextlib.nullcontext()


def running(row: Any, worker_id: str) -> contextlib.AbstractContextManager[Any]:
    """The run span of ``row`` while the pipeline processes it (nothing without tracing)."""
    return _NO_SPAN if tracing.tracer() is None else tracing.run_span(row, worker_id)


def job_line(worker_id: str, row: Any, state: str, elapsed: float | None = None,
             detail: str = "", *, name: str | None = None) -> None:
    """One job line: ``state`` of the row ``row`` after ``elapsed`` seconds (``name``: the
    job's name to show in the log, a django.tasks task's own)."""
    logs.job_line(worker_id, row, state, elapsed, detail, name=name)
    if state == JobState.RUNNING:
        return
    for record in _recorders:
        record(row, state, elapsed)
    for record_run in _run_recorders:
        record_run(worker_id, row, state, elapsed, detail)
    tracing.outcome(state, row.attempts)


def add_recorder(recorder: Recorder) -> None:
    if recorder not in _recorders:
        _recorders.append(recorder)


def recorders() -> tuple[Recorder, ...]:
    return tuple(_recorders)


def remove_recorder(recorder: Recorder) -> None:
    if recorder in _recorders:
        _recorders.remove(recorder)


def add_run_recorder(recorder: RunRecorder) -> None:
    """Call ``recorder`` with each finished job line (and its worker and detail)."""
    if recorder not in _run_recorders:
        _run_recorders.append(recorder)


def remove_run_recorder(recorder: RunRecorder) -> None:
    """Stop calling ``recorder``."""
    if recorder in _run_recorders:
        _run_recorders.remove(recorder)
