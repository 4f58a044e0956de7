"""Observability across real processes: a ``jobworker`` process's run span is the child of
the span that dispatched the job in this process (the context travels in the payload), and
``jobworker --concurrency 2 --log-format json --metrics-port`` prints one JSON object per
job line from its children and serves their summed counters on one port."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from django_jobguard import tracing
from django_jobguard.models import FailedJob, QueuedJob
from tests.support import jobs, wait_for
from tests.support.processes import MANAGE, ROOT, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_run_span_in_a_worker_process_is_a_child_of_the_dispatching_span(
        monkeypatch, tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer("django_jobguard"))
    with provider.get_tracer("tests").start_as_current_span("POST /orders") as request:
        done = jobs.Noop(1).dispatch()
        failed = jobs.FailMe().dispatch()
    dispatched = {s.attributes["jobguard.job_id"]: s for s in exporter.get_finished_spans()
                  if s.name.startswith("jobguard dispatch")}
    spans_file = tmp_path / "spans.jsonl"
    env = worker_env(JOBGUARD_TEST_SPANS=str(spans_file),
                     JOBGUARD_EXTRA_JOB_MODULES="tests.support.otel_spans")
    run = subprocess.run([sys.executable, str(MANAGE), "jobworker", "--stop-when-empty",
                          "--memory", "0"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    runs = {s["attributes"]["jobguard.job_id"]: s
            for s in map(json.loads, spans_file.read_text().splitlines())
            if s["name"].startswith("jobguard run")}
    trace_id = f"{request.get_span_context().trace_id:032x}"
    for row, outcome, status in ((done, "done", "UNSET"), (failed, "failed", "ERROR")):
        span = runs[row.id]
        assert span["trace_id"] == trace_id
        assert span["parent_span_id"] == f"{dispatched[row.id].context.span_id:016x}"
        assert span["kind"] == "CONSUMER" and span["status"] == status
        assert span["attributes"]["jobguard.outcome"] == outcome
        assert span["attributes"]["jobguard.attempt"] == 1
    assert "exception" in runs[failed.id]["events"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(metrics: dict, job: str, outcome: str) -> float:
    return metrics.get(("jobguard_jobs_total", (
        ("job", f"tests.support.jobs.{job}"), ("outcome", outcome), ("queue", "default"))), 0)


def test_concurrency_children_log_json_and_share_one_metrics_port(tmp_path):
    noops = {jobs.Noop(i).dispatch().id for i in range(6)}
    jobs.FailMe().dispatch()
    jobs.ReleaseMe().dispatch()  # tries=2: released twice, then failed
    port = free_port()
    out, err = (tmp_path / "out.log").open("w+"), (tmp_path / "err.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, str(MANAGE), "jobworker", "--concurrency", "2", "--log-format",
         "json", "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
         "--sleep", "0.2", "--memory", "0"],
        env=worker_env(TMPDIR=str(tmp_path)), cwd=ROOT, stdout=out, stderr=err, text=True)
    try:
        wait_for(lambda: not QueuedJob.objects.exists() and FailedJob.objects.count() == 2,
                 timeout=120, what="every job finished")
        expected = {("Noop", "done"): 6, ("FailMe", "failed"): 1,
                    ("ReleaseMe", "released"): 2, ("ReleaseMe", "failed"): 1}
        # The counters are written just after each job's outcome: wait for the last ones.
        metrics = wait_for(lambda: (lambda m: m if all(
            total(m, *key) == n for key, n in expected.items()) else None)(scrape(port)),
            timeout=30, what=f"the counters {expected}")
        assert metrics[("jobguard_job_duration_seconds_count", (
            ("job", "tests.support.jobs.Noop"), ("queue", "default")))] == 6
        assert list(tmp_path.glob("jobguard-metrics-*"))  # multiprocess files, while running
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    out.seek(0)
    err.seek(0)
    output, errors = out.read(), err.read()
    assert code == 0, output + errors
    lines = [json.loads(line) for line in output.splitlines()]  # every line is JSON
    start = lines.pop(0)  # the supervisor's start-up line, then the job lines
    assert (start["processes"], start["pid"]) == (2, proc.pid), start
    assert {line["job_id"] for line in lines if line["state"] == "DONE"} == noops
    assert {line["state"] for line in lines} == {"DONE", "FAILED", "RELEASED"}
    for line in lines:
        assert line["logger"] == "django_jobguard.worker.jobs" and line["queue"] == "default"
        host, pid, _ = line["worker_id"].split(":")
        assert int(pid) != proc.pid  # a child's id, not the supervisor's
    assert not list(tmp_path.glob("jobguard-metrics-*"))  # cleaned up at exit
