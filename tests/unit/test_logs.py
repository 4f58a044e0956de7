"""The worker's job lines as ``logging`` records: their fields, the JSON formatter, and when
``jobworker`` installs its own handler (only when the project's LOGGING would not show them,
or when ``--log-format`` asks)."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.color import no_style

from django_jobguard import logs
from django_jobguard.testing import drain
from tests.support import jobs

pytestmark = pytest.mark.django_db


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def job_logger():
    """The job logger as the test found it, put back afterwards (level, handlers, propagate),
    and its parent ``django_jobguard.worker``'s handlers."""
    loggers = [logs.job_logger, logging.getLogger("django_jobguard.worker")]
    saved = [(lg, lg.level, list(lg.handlers), lg.propagate) for lg in loggers]
    yield logs.job_logger
    for lg, level, handlers, propagate in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate = propagate


@pytest.fixture
def collected(job_logger):
    handler = Collect()
    job_logger.addHandler(handler)
    job_logger.setLevel(logging.DEBUG)
    yield handler.records


def test_each_job_line_is_one_record_with_structured_fields(collected):
    done = jobs.Noop(1).dispatch()
    failed = jobs.FailMe().dispatch()
    drain()
    by_job = {r.job_id: r for r in collected}
    ok, bad = by_job[done.id], by_job[failed.id]
    assert (ok.levelno, ok.state, ok.job, ok.queue, ok.attempt) == (
        logging.INFO, "DONE", "tests.support.jobs.Noop", "default", 1)
    assert ok.worker_id.startswith("drain") and ok.elapsed >= 0 and ok.detail == ""
    assert ok.getMessage().startswith(f"tests.support.jobs.Noop [{done.id}] DONE ")
    assert (bad.levelno, bad.state) == (logging.WARNING, "FAILED")
    assert "no point retrying" in bad.detail


def test_json_formatter_writes_one_object_with_the_fields(collected):
    row = jobs.Boom("kaput").dispatch()
    drain()
    record = next(r for r in collected if r.job_id == row.id)
    data = json.loads(logs.JsonFormatter().format(record))
    assert data["logger"] == "django_jobguard.worker.jobs" and data["level"] == "INFO"
    assert {k: data[k] for k in ("job_id", "job", "queue", "state", "attempt")} == {
        "job_id": row.id, "job": "tests.support.jobs.Boom", "queue": "default",
        "state": "RELEASED", "attempt": 1}
    assert data["detail"] == "exception, retry in 30 s"
    assert isinstance(data["elapsed"], float) and data["worker_id"] == record.worker_id
    assert data["time"].endswith("+00:00")


def test_json_formatter_keeps_extras_tracebacks_and_the_bound_worker():
    logs.bind_worker("host:1:abc")
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.getLogger("django_jobguard.worker").makeRecord(
            "django_jobguard.worker", logging.ERROR, __file__, 1, "claim %s", ("failed",),
            exc_info=__import__("sys").exc_info(), extra={"count": 3})
    finally:
        data = json.loads(logs.JsonFormatter().format(record))
        logs.bind_worker("")
    assert data["message"] == "claim failed" and data["count"] == 3
    assert data["worker_id"] == "host:1:abc"
    assert "ValueError: bad" in data["exception"]


def test_the_text_formatter_prints_the_worker_line_with_the_worker_id(collected):
    row = jobs.Noop(2).dispatch()
    drain()
    record = next(r for r in collected if r.job_id == row.id)
    line = logs.JobLineFormatter().format(record)
    assert f" {record.worker_id} tests.support.jobs.Noop [{row.id}] ..." in line
    assert line.endswith(" ms") and " DONE " in line


def test_command_installs_its_handler_when_logging_does_not_show_job_lines(job_logger):
    # tests.settings: "django_jobguard" at WARNING with a console handler, as a project
    # that wants jobguard's warnings: the job lines (INFO) would not show, so the command
    # prints them itself, and only once (not also through that handler).
    assert not logs.shown_by_project()
    jobs.Noop(1).dispatch()
    out = StringIO()
    call_command("jobworker", "--once", "--memory", "0", "-v", "2", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and " INFO jobguard " in lines[0], lines  # the start-up line
    assert lines[1].endswith(" RUNNING") and " DONE " in lines[2], lines
    assert job_logger.handlers == [] and job_logger.propagate  # removed after the command


def test_command_leaves_job_lines_to_a_project_that_routes_them(job_logger):
    project = Collect()
    worker_logger = logging.getLogger("django_jobguard.worker")
    worker_logger.addHandler(project)
    worker_logger.setLevel(logging.INFO)
    assert logs.shown_by_project()
    row = jobs.Noop(1).dispatch()
    out = StringIO()
    call_command("jobworker", "--once", "--memory", "0", stdout=out)
    assert out.getvalue() == ""
    assert [(r.job_id, r.state) for r in project.records if hasattr(r, "job_id")] == [
        (row.id, "DONE")]


def test_log_format_json_prints_json_lines_even_when_logging_is_configured(job_logger):
    project = Collect()
    logging.getLogger("django_jobguard.worker").addHandler(project)
    logging.getLogger("django_jobguard.worker").setLevel(logging.INFO)
    row = jobs.Noop(1).dispatch()
    out = StringIO()
    call_command("jobworker", "--once", "--memory", "0", "--log-format", "json", stdout=out)
    start, data = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (start["queues"], start["database"], start["threads"]) == (["default"], "default", 1)
    assert (data["job_id"], data["state"], data["attempt"]) == (row.id, "DONE", 1)
    assert not [r for r in project.records if hasattr(r, "job_id")]  # not printed twice


def test_verbosity_zero_prints_nothing(job_logger):
    jobs.FailMe().dispatch()
    out = StringIO()
    call_command("jobworker", "--once", "--memory", "0", "-v", "0", stdout=out)
    assert out.getvalue() == ""


def test_install_handler_rejects_an_unknown_format():
    with pytest.raises(ValueError, match="Unknown log format 'xml'; use one of text, json"):
        logs.install_handler(1, "xml")


class _Row:
    id, name, queue, attempts = "42", "tests.support.jobs.Noop", "default", 2


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize(("state", "elapsed", "detail"), [
    ("DONE", 0.0123, ""), ("RELEASED", 0.5, "exception, retry in 30 s"),
    ("FAILED", 1.0, "no point retrying"), ("RUNNING", None, "")])
def test_the_direct_job_line_is_the_records_line(job_logger, monkeypatch, log_format, state,
                                                  elapsed, detail):
    # jobworker's own handler gets the line's fields without a LogRecord; a filter on it
    # sends the same line through logging: both print the same text.
    import time

    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.25)
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_250_000_000)
    out = StringIO()
    installed = logs.install_handler(2, log_format, stream=out, style=no_style())
    assert isinstance(installed.handler, logs.JobLineHandler)
    passed: list[logging.LogRecord] = []
    made = []
    make = job_logger.makeRecord
    monkeypatch.setattr(job_logger, "makeRecord", lambda *a, **k: made.append(1) or make(*a, **k))
    try:
        logs.job_line("host:1:abc", _Row(), state, elapsed, detail)
        assert made == []  # no record built
        direct = out.getvalue()
        installed.handler.addFilter(lambda record: passed.append(record) or True)
        logs.job_line("host:1:abc", _Row(), state, elapsed, detail)
    finally:
        installed.remove()
    by_record = out.getvalue()[len(direct):]
    assert len(passed) == len(made) == 1  # the second went through logging
    assert direct.count("\n") == 1
    assert direct == by_record, (direct, by_record)
    if log_format == "json":
        data = json.loads(direct)
        assert (data["job_id"], data["state"], data["attempt"]) == ("42", state, 2)
        assert data["message"].startswith(f"tests.support.jobs.Noop [42] {state}")
    else:
        assert "host:1:abc tests.support.jobs.Noop [42] ..." in direct


def test_job_lines_go_through_logging_when_another_handler_listens(job_logger):
    out = StringIO()
    installed = logs.install_handler(1, "text", stream=out, style=no_style())
    project = Collect()
    job_logger.addHandler(project)
    try:
        logs.job_line("host:1:abc", _Row(), "DONE", 0.01)
    finally:
        installed.remove()
    assert [r.job_id for r in project.records] == ["42"] and " DONE 10 ms" in out.getvalue()


def test_job_lines_are_records_again_under_a_record_factory(job_logger):
    # A factory (OpenTelemetry's logging instrumentation) adds fields to every record: the
    # job line must carry them, so it is a record then (a review's finding).
    made = []
    factory = logging.getLogRecordFactory()

    def stamped(*args, **kwargs):
        record = factory(*args, **kwargs)
        record.otelTraceID = "abc123"
        made.append(record)
        return record

    out = StringIO()
    installed = logs.install_handler(1, "json", stream=out, style=no_style())
    logging.setLogRecordFactory(stamped)
    try:
        logs.job_line("host:1:abc", _Row(), "DONE", 0.01)
    finally:
        logging.setLogRecordFactory(factory)
        installed.remove()
    assert len(made) == 1 and json.loads(out.getvalue())["otelTraceID"] == "abc123"


def test_a_job_line_that_cannot_be_written_is_reported_once_not_written_twice(
        job_logger, monkeypatch):
    # The write went out, its flush failed: logging's handleError reports it, and the line
    # is not written again through a record (a review's finding).
    class Flaky(StringIO):
        def flush(self):
            raise BlockingIOError("flush would block")

    out = Flaky()
    installed = logs.install_handler(1, "text", stream=out, style=no_style())
    reported = []
    monkeypatch.setattr(installed.handler, "handleError", reported.append)
    try:
        logs.job_line("host:1:abc", _Row(), "DONE", 0.01)
    finally:
        installed.remove()
    assert out.getvalue().count(" DONE 10 ms") == 1
    assert [(r.job_id, r.state) for r in reported] == [("42", "DONE")]
