"""OpenTelemetry spans: the dispatch span's context travels in the payload and the run span
is its child, with the outcome, the attempt and the job's exception; payloads without it
(older rows) still run; nothing is added while no SDK is configured."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_jobguard import dispatch_many, tracing
from django_jobguard.models import QueuedJob
from django_jobguard.testing import drain
from tests.support import jobs, make_due

pytestmark = pytest.mark.django_db


@pytest.fixture
def exporter(monkeypatch):
    """An SDK tracer for jobguard and for the test's own "request" span (the process-wide
    provider is left alone: other tests must see tracing unconfigured)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer("django_jobguard"))
    exporter.tracer = provider.get_tracer("tests")
    return exporter


def spans(exporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_the_run_span_is_a_child_of_the_dispatch_span_of_the_request(exporter):
    with exporter.tracer.start_as_current_span("GET /signup") as request:
        row = jobs.Noop(1).dispatch()
    assert set(QueuedJob.objects.get(id=row.id).payload["trace"]) >= {"traceparent"}
    drain()
    (dispatch,) = spans(exporter, "jobguard dispatch tests.support.jobs.Noop")
    (run,) = spans(exporter, "jobguard run tests.support.jobs.Noop")
    assert dispatch.parent.span_id == request.get_span_context().span_id
    assert run.parent.span_id == dispatch.context.span_id
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.kind.name == "CONSUMER" and dispatch.kind.name == "PRODUCER"
    assert {k: run.attributes[k] for k in ("jobguard.job_id", "jobguard.queue",
                                           "jobguard.attempt", "jobguard.outcome")} == {
        "jobguard.job_id": row.id, "jobguard.queue": "default", "jobguard.attempt": 1,
        "jobguard.outcome": "done"}
    assert run.status.status_code.name == "UNSET"


def test_exceptions_are_recorded_and_a_failure_is_an_error(exporter):
    released = jobs.Boom("kaput").dispatch()
    failed = jobs.FailMe().dispatch()
    drain()
    runs = {s.attributes["jobguard.job_id"]: s for s in exporter.get_finished_spans()
            if s.name.startswith("jobguard run")}
    retry = runs[released.id]
    assert retry.attributes["jobguard.outcome"] == "released"
    (event,) = [e for e in retry.events if e.name == "exception"]
    assert event.attributes["exception.message"] == "kaput"
    assert runs[failed.id].attributes["jobguard.outcome"] == "failed"
    assert runs[failed.id].status.status_code.name == "ERROR"
    make_due()
    drain()  # the retry: a second run span under the same dispatch span, attempt 2
    second = [s for s in spans(exporter, "jobguard run tests.support.jobs.Boom")
              if s is not retry]
    assert second[0].attributes["jobguard.attempt"] == 2
    assert second[0].parent.span_id == retry.parent.span_id


def test_a_payload_without_trace_context_runs_in_a_new_trace(exporter):
    row = jobs.Noop(1).dispatch()
    queued = QueuedJob.objects.get(id=row.id)
    queued.payload.pop("trace", None)  # as an older release wrote it
    queued.save(update_fields=["payload"])
    assert drain().done == 1
    (run,) = spans(exporter, "jobguard run tests.support.jobs.Noop")
    assert run.parent is None and run.attributes["jobguard.outcome"] == "done"


def test_each_job_of_dispatch_many_has_a_dispatch_span_of_its_own(exporter):
    """``dispatch_many`` asks once whether tracing is on; when it is, every row's payload
    carries the context of its own dispatch span."""
    handles = dispatch_many([jobs.Noop(1), jobs.Noop(2), jobs.Record("r")])
    traces = [QueuedJob.objects.get(id=h.id).payload["trace"] for h in handles]
    assert len({trace["traceparent"] for trace in traces}) == 3
    sent = spans(exporter, "jobguard dispatch tests.support.jobs.Noop")
    assert sorted(span.attributes["jobguard.job_id"] for span in sent) == sorted(
        h.id for h in handles[:2])


def test_nothing_is_added_while_no_sdk_is_configured():
    # The API is installed (test extra) but no tracer provider is set in this process.
    row = jobs.Noop(1).dispatch()
    assert "trace" not in QueuedJob.objects.get(id=row.id).payload
    assert drain().done == 1


def test_without_opentelemetry_everything_runs_untraced(monkeypatch):
    monkeypatch.setattr(tracing, "trace", None)  # as if the package were not installed
    row = jobs.Boom().dispatch()
    assert "trace" not in QueuedJob.objects.get(id=row.id).payload
    assert drain().released == 1
