"""Worker subprocesses of the tracing tests: with ``JOBGUARD_TEST_SPANS=<file>`` set, this
module (loaded through ``JOBGUARD_EXTRA_JOB_MODULES``) configures the OpenTelemetry SDK to
write every finished span to that file as one JSON object per line."""

from __future__ import annotations

import json
import os

SPANS_FILE = os.environ.get("JOBGUARD_TEST_SPANS", "")


def span_record(span) -> dict:
    context = span.get_span_context()
    return {"name": span.name, "trace_id": f"{context.trace_id:032x}",
            "span_id": f"{context.span_id:016x}",
            "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
            "kind": span.kind.name, "attributes": dict(span.attributes),
            "status": span.status.status_code.name,
            "events": [event.name for event in span.events]}


if SPANS_FILE:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):
        def export(self, spans):
            with open(SPANS_FILE, "a") as out:
                for span in spans:
                    out.write(json.dumps(span_record(span), default=str) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)
