"""OpenTelemetry spans for dispatch and run, with the trace context carried in the payload.

Optional (``pip install 'django-jobguard[otel]'``, then configure an OpenTelemetry SDK as
for the rest of the project): without ``opentelemetry-api`` nothing here imports it and
every function is a no-op, and so it is with the API but no tracer provider set (nothing
is added to payloads).

- ``jobguard dispatch <job>`` (PRODUCER): a child of the span current when the job is
  dispatched (a request's, a job's); its W3C trace context (``traceparent``, ``tracestate``)
  is stored in the payload's ``trace`` entry.
- ``jobguard run <job>`` (CONSUMER): around the worker's processing of one row, a child of
  that dispatch span (a payload without ``trace``, e.g. queued by an older release, gives a
  new trace). Attributes: ``jobguard.job``, ``jobguard.job_id``, ``jobguard.queue``,
  ``jobguard.attempt``, ``jobguard.outcome`` (``done``, ``released``, ``failed``, …) and the
  messaging ones; the job's exception is recorded on it and a failure sets its status to
  ERROR. Spans the job's own code starts are children of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django_jobguard import signals
from django_jobguard.outcome import JobState

try:
    from opentelemetry import propagate, trace
except ImportError:  # the optional extra is not installed
    trace = None  # type: ignore[assignment]
    propagate = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django_jobguard.envelope import Envelope

#: The payload entry holding the dispatching span's context.
PAYLOAD_KEY = "trace"
SYSTEM = "jobguard"
#: The outcomes whose span gets an error status.
_ERRORS = frozenset(state for state in JobState if state.is_failure)


_cached: tuple[Any, Any] = (None, None)  # (provider, its tracer)
_unset_until = 0.0  # monotonic time until which "no provider" is taken as still true
_UNSET = () if trace is None else (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def tracer() -> Any:
    """jobguard's tracer from the project's tracer provider, or ``None`` while none is set
    (OpenTelemetry's proxy or no-op provider): the worker then skips even the non-recording
    spans, so an unconfigured API costs next to nothing per job."""
    global _cached, _unset_until
    if trace is None:
        return None
    now = time.monotonic()
    if now < _unset_until:
        return None
    provider = trace.get_tracer_provider()
    if type(provider) in _UNSET:  # not isinstance: an ABC's check costs more than the rest
        # Asking costs microseconds (an os.environ lookup), twice per job: a provider set
        # later (at start-up, usually before the first job) is seen within a second.
        _unset_until = now + 1.0
        return None
    if _cached[0] is not provider:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("django-jobguard")
        except PackageNotFoundError:  # run from a checkout that was never installed
            installed = None
        _cached = (provider, provider.get_tracer("django_jobguard", installed))
    return _cached[1]


def dispatched(name: str, row: Any, envelope: Envelope) -> Envelope:
    """Record the dispatch span of the job ``name`` whose row ``row`` is being built, and
    return ``envelope`` carrying its trace context (unchanged when tracing is off)."""
    jobguard_tracer = tracer()
    if jobguard_tracer is None:
        return envelope
    carrier: dict[str, str] = {}
    with jobguard_tracer.start_as_current_span(
            f"jobguard dispatch {name}", kind=trace.SpanKind.PRODUCER, attributes={
                "messaging.system": SYSTEM, "messaging.operation.type": "send",
                "messaging.destination.name": row.queue, "messaging.message.id": str(row.id),
                "jobguard.job": name, "jobguard.job_id": str(row.id),
                "jobguard.queue": row.queue}) as span:
        if span.get_span_context().is_valid:
            propagate.inject(carrier)
    if not carrier:
        return envelope
    return envelope.replace(extra={**envelope.extra, PAYLOAD_KEY: carrier})


@contextlib.contextmanager
def run_span(row: Any, worker_id: str = "") -> Iterator[Any]:
    """The span of one row's processing by a worker, current while it runs."""
    jobguard_tracer = tracer()
    if jobguard_tracer is None:
        yield None
        return
    payload = row.payload if isinstance(row.payload, dict) else {}
    carrier = payload.get(PAYLOAD_KEY)
    parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
    attributes = {"messaging.system": SYSTEM, "messaging.operation.type": "process",
                  "messaging.destination.name": row.queue,
                  "messaging.message.id": str(row.id), "jobguard.job": row.name,
                  "jobguard.job_id": str(row.id), "jobguard.queue": row.queue,
                  "jobguard.attempt": row.attempts}
    if worker_id:
        attributes["jobguard.worker_id"] = worker_id
    with jobguard_tracer.start_as_current_span(f"jobguard run {row.name}", context=parent,
                                         kind=trace.SpanKind.CONSUMER,
                                         attributes=attributes) as span:
        yield span


def outcome(state: str, attempt: int | None = None) -> None:
    """Set the run span's outcome (from the job line's state)."""
    if tracer() is None:
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("jobguard.outcome", state.lower())
    if attempt is not None:
        span.set_attribute("jobguard.attempt", attempt)
    if state in _ERRORS:
        span.set_status(trace.Status(trace.StatusCode.ERROR, state.lower()))


def _record_exception(sender: Any, exception: BaseException | None = None,
                      **kwargs: Any) -> None:
    if exception is None or tracer() is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.record_exception(exception)


signals.job_failed.connect(_record_exception, dispatch_uid="jobguard-tracing-failed")
signals.job_released.connect(_record_exception, dispatch_uid="jobguard-tracing-released")
