"""The worker's job lines as Python ``logging`` records, and the formatters that print them.

Every job line (``RUNNING``, ``DONE``, ``RELEASED``, ``FAILED``, …) is one record on the
``django_jobguard.worker.jobs`` logger (a child of ``django_jobguard.worker``, so a project
that routes the worker's logger gets them too) with structured attributes: ``worker_id``,
``job_id``, ``job``, ``queue``, ``state``, ``attempt``, ``elapsed`` (seconds, ``None`` for
``RUNNING``) and ``detail``. Levels: ``RUNNING`` DEBUG, ``FAILED`` and ``LOST`` WARNING, the
other outcomes INFO.

``jobworker`` shows them on its stdout without any ``LOGGING`` setting, as ``runserver``
shows its request lines: :func:`install_handler` adds a handler only when the project's
configuration would not show them (no handler on the logger's way to the root, or the
logger not enabled for INFO), or when ``--log-format`` asks for one explicitly.
:class:`JobLineFormatter` prints the human line, :class:`JsonFormatter` one JSON object per
line (usable in ``LOGGING`` for any logger). While that handler (:class:`JobLineHandler`)
is the logger's only way out, a job line reaches it without a record being built: the same
text, at about half the CPU; any handler, filter or record factory of the project's gets
records again.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_jobguard.outcome import JobState

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

JOB_LOGGER = "django_jobguard.worker.jobs"
job_logger = logging.getLogger(JOB_LOGGER)

#: Level of each state's line; unnamed states are INFO.
LEVELS: dict[str, int] = {JobState.RUNNING: logging.DEBUG,
          **{state: logging.WARNING for state in JobState if state.is_failure}}
#: The job line's structured attributes, in the order :class:`JsonFormatter` writes them.
FIELDS = ("worker_id", "job_id", "job", "queue", "state", "attempt", "elapsed", "detail")
FORMATS = ("text", "json")

_bound = threading.local()


def bind_worker(worker_id: str) -> None:
    """Name the worker this thread works for: records logged in it that carry no
    ``worker_id`` get this one from the formatters (warnings of the loop and heartbeat)."""
    _bound.worker_id = worker_id


def current_worker() -> str:
    return getattr(_bound, "worker_id", "")


def job_line(worker_id: str, row: Any, state: str, elapsed: float | None = None,
             detail: str = "", *, name: str | None = None) -> None:
    """Log one job line for the queued row ``row`` (cheap when nobody listens); ``name``:
    the job's name to show (a django.tasks task's own), by default ``row.name``."""
    level = LEVELS.get(state, logging.INFO)
    if not job_logger.isEnabledFor(level):
        return
    tail = (f" {elapsed * 1000:.0f} ms" if elapsed is not None else "") + (
        f" ({detail})" if detail else "")
    job = name or row.name
    args = (job, row.id, state, tail)
    fields = {"worker_id": worker_id, "job_id": str(row.id), "job": job, "queue": row.queue,
              "state": state, "attempt": row.attempts, "elapsed": elapsed, "detail": detail}
    try:
        (handler,) = job_logger.handlers  # (a copy: the command may remove it meanwhile)
    except ValueError:
        handler = None
    if (isinstance(handler, JobLineHandler) and not job_logger.propagate
            and not job_logger.filters and _plain_records()
            and handler.write_job(level, fields, args)):
        return
    # makeRecord + handle: what Logger.log does, without looking up the caller's frame (the
    # caller is always the pipeline; that lookup is a good part of a record's cost).
    job_logger.handle(job_logger.makeRecord(
        JOB_LOGGER, level, __file__, 0, _MESSAGE, args, None, "job_line", extra=fields))


#: The job line's message (``getMessage()``): job, id, state, then elapsed and detail.
_MESSAGE = "%s [%s] %s%s"


def _plain_records() -> bool:
    """Whether a job line's record would hold nothing but :func:`job_line`'s fields: no
    record factory of the project's (OpenTelemetry's logging instrumentation adds trace ids)
    and no logger class of its own with another ``makeRecord``."""
    return (logging.getLogRecordFactory() is logging.LogRecord
            and type(job_logger).makeRecord is logging.Logger.makeRecord)


def text_line(stamp: str, job: str, job_id: str, state: str, elapsed: float | None = None,
              detail: str = "", worker_id: str = "") -> str:
    """The human job line: ``<time> <worker> <job> [<id>] ...... DONE 12 ms (detail)``."""
    worker = f"{worker_id} " if worker_id else ""
    head = f"{stamp} {worker}{job} [{job_id}] "
    tail = f" {state}" + (f" {elapsed * 1000:.0f} ms" if elapsed is not None else "")
    # The states line up at column 100 past the worker id (the same width on one host).
    line = head + "." * max(3, 100 + len(worker) - len(head) - len(tail)) + tail
    return f"{line} ({detail})" if detail else line


def palette(colors: Any) -> dict[str, Callable[[str], str]]:
    """The colour of each job line state, from a Django ``color_style()`` (done green, failed
    and lost red, released yellow; other states plain)."""
    out: dict[str, Callable[[str], str]] = {JobState.DONE: colors.SUCCESS,
                                            JobState.RELEASED: colors.WARNING}
    out.update({state: colors.ERROR for state in JobState if state.is_failure})
    return out


class JobLineFormatter(logging.Formatter):
    """The job line as ``jobworker`` prints it (local time, worker id, dots to the state),
    coloured by outcome with ``colors`` (a Django ``color_style()``); other records as
    ``<time> <level> <message>``."""

    def __init__(self, *args: Any, colors: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.palette: dict[str, Callable[[str], str]] = {}
        if colors is not None:
            self.palette = palette(colors)
        self._stamp: tuple[int, str] = (-1, "")

    def stamp(self, created: float) -> str:
        second = int(created)
        stamp = self._stamp  # (one read: another thread may replace it meanwhile)
        if stamp[0] != second:  # formatting the local time once a second is enough
            from django.utils import timezone

            moment = datetime.datetime.fromtimestamp(second, tz=datetime.UTC)
            stamp = self._stamp = (
                second, timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S"))
        return stamp[1]

    def format(self, record: logging.LogRecord) -> str:
        state = getattr(record, "state", None)
        if state is None or not hasattr(record, "job_id"):
            text = f"{self.stamp(record.created)} {record.levelname} {record.getMessage()}"
            if record.exc_info:
                text += "\n" + self.formatException(record.exc_info)
            return text
        return self.format_job(record.created, record.levelno, vars(record), ())

    def format_job(self, created: float, level: int, fields: dict[str, Any],
                   args: tuple[Any, ...]) -> str:
        """The line of a job line's ``fields`` (as :func:`job_line` sets them), logged at
        ``created`` (``level`` and the message's ``args`` are the JSON formatter's)."""
        state = fields["state"]
        line = text_line(self.stamp(created), fields["job"], fields["job_id"], state,
                         fields["elapsed"], fields["detail"],
                         worker_id=fields.get("worker_id") or current_worker())
        paint = self.palette.get(state)
        return paint(line) if paint else line


#: Attributes every LogRecord has; anything else came from ``extra`` and goes into the JSON.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, the job line's fields when present (``worker_id``, ``job_id``, ``job``,
    ``queue``, ``state``, ``attempt``, ``elapsed``, ``detail``), any other ``extra``
    attribute, and ``exception`` (the traceback) when the record has one.

    ``LOGGING = {"formatters": {"json": {"()": "django_jobguard.logs.JsonFormatter"}}, …}``
    """

    def format(self, record: logging.LogRecord) -> str:
        data = self._data(record.created, record.levelname, record.name, record.getMessage(),
                          vars(record))
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in data:
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=str, ensure_ascii=False)

    def format_job(self, created: float, level: int, fields: dict[str, Any],
                   args: tuple[Any, ...]) -> str:
        """The object of a job line's ``fields`` (as :func:`job_line` sets them), logged at
        ``created`` and ``level`` with the message's ``args``: what :meth:`format` writes
        for its record."""
        data = self._data(created, logging.getLevelName(level), JOB_LOGGER, _MESSAGE % args,
                          fields)
        return json.dumps(data, default=str, ensure_ascii=False)

    @staticmethod
    def _data(created: float, level: str, logger: str, message: str,
              fields: dict[str, Any]) -> dict[str, Any]:
        """The head of each object, with the job line's fields when ``fields`` has them."""
        data: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
            .isoformat(timespec="milliseconds"),
            "level": level,
            "logger": logger,
            "message": message,
        }
        worker = fields.get("worker_id") or current_worker()
        if worker:
            data["worker_id"] = worker
        for key in FIELDS[1:]:
            if key in fields:
                data[key] = fields[key]
        if isinstance(data.get("elapsed"), float):
            data["elapsed"] = round(data["elapsed"], 6)
        return data


class JobLineHandler(logging.StreamHandler):
    """The handler ``jobworker`` installs (:func:`install_handler`). When it is the job
    logger's only way out (no filter, no other handler, no propagation), :func:`job_line`
    hands it the line's fields directly: the same text, without a ``LogRecord`` (building
    and handling one was about half a job line's CPU in a worker)."""

    jobguard_installed = True

    def write_job(self, level: int, fields: dict[str, Any], args: tuple[Any, ...]) -> bool:
        """Write one job line; False, nothing written, when it must go through ``logging``
        (a filter, a level, a formatter of the project's). A line that cannot be formatted
        or written is reported as ``logging`` reports a record's (``handleError``), once."""
        formatter = self.formatter
        if self.filters or level < self.level or type(formatter) not in _DIRECT:
            return False
        created = time.time()
        try:
            text = formatter.format_job(created, level, fields, args)  # type: ignore[union-attr]
            with self.lock:  # type: ignore[union-attr]
                self.stream.write(text + self.terminator)
                self.flush()
        except RecursionError:  # as logging's own handlers do
            raise
        except Exception:
            record = job_logger.makeRecord(JOB_LOGGER, level, __file__, 0, _MESSAGE, args,
                                           None, "job_line", extra=fields)
            record.created = created
            self.handleError(record)
        return True


#: The formatters :meth:`JobLineHandler.write_job` calls directly (their subclasses may
#: format a record differently: those get records).
_DIRECT = (JobLineFormatter, JsonFormatter)


def shown_by_project() -> bool:
    """Whether the project's ``LOGGING`` already shows the job lines: the job logger is
    enabled for INFO and a handler sits on its way to the root (the root's included)."""
    if not job_logger.isEnabledFor(logging.INFO):
        return False
    logger: logging.Logger | None = job_logger
    while logger is not None:
        if any(not getattr(h, "jobguard_installed", False) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


class Installed:
    """What :func:`install_handler` changed, to undo it (:meth:`remove`)."""

    def __init__(self, handler: logging.Handler | None, level: int, propagate: bool) -> None:
        self.handler = handler
        self._level = level
        self._propagate = propagate

    def remove(self) -> None:
        if self.handler is not None:
            job_logger.removeHandler(self.handler)
        job_logger.setLevel(self._level)
        job_logger.propagate = self._propagate


def install_handler(verbosity: int = 1, log_format: str | None = None, *,
                    stream: SupportsWrite[str] | None = None,
                    style: Any = None) -> Installed | None:
    """Show the job lines on ``stream`` (stdout) at ``verbosity`` (0: none, 1: outcomes,
    2: also RUNNING) unless the project's ``LOGGING`` shows them already; an explicit
    ``log_format`` (``text``/``json``) installs the handler in any case. Returns what to
    :meth:`~Installed.remove`, or ``None`` when the project's configuration is left as is."""
    if log_format is not None and log_format not in FORMATS:
        raise ValueError(f"Unknown log format {log_format!r}; use one of {', '.join(FORMATS)}.")
    for old in [h for h in job_logger.handlers if getattr(h, "jobguard_installed", False)]:
        job_logger.removeHandler(old)  # a handler left by an earlier run in this process
    if log_format is None and shown_by_project():
        return None
    installed = Installed(None, job_logger.level, job_logger.propagate)
    job_logger.propagate = False  # not printed twice by a handler of a parent logger
    if verbosity <= 0:
        job_logger.setLevel(logging.CRITICAL + 1)
        return installed
    handler = JobLineHandler(stream if stream is not None else sys.stdout)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        if style is None:
            from django.core.management.color import color_style

            style = color_style()
        handler.setFormatter(JobLineFormatter(colors=style))
    job_logger.setLevel(logging.DEBUG if verbosity >= 2 else logging.INFO)
    job_logger.addHandler(handler)
    installed.handler = handler
    return installed
