"""``manage.py jobworker``: run jobs from the queue (options follow Laravel's ``queue:work``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError

from django_jobguard import logs
from django_jobguard.checks import check_skip_locked
from django_jobguard.conf import jobguard_settings, queue_database
from django_jobguard.queue import migrate_message, unapplied_migrations
from django_jobguard.worker.loop import WorkerOptions, make_worker, run_worker_process
from django_jobguard.worker.queue_selection import parse_queues


def _csv_floats(value: str) -> list[float]:
    try:
        return [float(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise CommandError(f"--backoff takes seconds, comma separated (e.g. 1,5,10), not {value!r}")


def startup(options: WorkerOptions, opts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What a worker says about itself as it starts (version, pid, queues, database, store,
    how many jobs it runs at once): the line, and the same as fields for JSON logs."""
    import os

    from django.db import connections

    import django_jobguard

    connection = connections[options.using]
    name = connection.settings_dict.get("NAME") or ""
    processes, threads = opts["concurrency"], opts["threads"]
    asyncs = opts["async_concurrency"] or jobguard_settings.ASYNC_CONCURRENCY
    mode = (f"{processes} process{'es' if processes > 1 else ''}"
            f"{' with --reload' if opts['reload'] else ''}, "
            f"{threads} thread{'s' if threads > 1 else ''} "
            f"{'each' if processes > 1 else 'for sync jobs'}, up to {asyncs} async jobs "
            f"at once{' each' if processes > 1 else ''}")
    line = (f"jobguard {django_jobguard.__version__} worker, pid {os.getpid()}: queues "
            f"{', '.join(options.queues)}; database {options.using!r} ({connection.vendor}"
            f"{' ' + str(name) if name else ''}); store {jobguard_settings.STORE!r}; {mode}.")
    return line, {"version": django_jobguard.__version__, "pid": os.getpid(),
                  "queues": list(options.queues), "database": options.using,
                  "vendor": connection.vendor, "store": jobguard_settings.STORE,
                  "processes": processes, "threads": threads, "async_concurrency": asyncs}


def unseen_queues(queues: list[str], *, using: str) -> list[str]:
    """A warning for each queue in ``queues`` that jobguard has never seen (a typo such as
    ``--queue biling`` serves nothing), naming a known queue that looks like it."""
    import difflib

    from django_jobguard.operations.pausing import is_known_queue, known_queues

    warnings = []
    for name in queues:
        if name == "*" or is_known_queue(name, using=using):
            continue
        close = difflib.get_close_matches(name, sorted(known_queues(using=using)), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        warnings.append(f"Queue {name!r} has never been seen: no job, worker or "
                        f"registered job uses it.{hint} This worker serves it anyway, "
                        f"should jobs be queued there.")
    return warnings


class Command(BaseCommand):
    help = "Process jobs from the queue until stopped (SIGTERM/SIGINT finish the current job)."
    # The checks that concern a worker: jobguard's own (registered as compatibility checks) and
    # the models'. The URLconf's, the admin's and the templates' are the web process's (and
    # `manage.py check`'s): loading the URLconf with the admin and the REST API for them was
    # about 0.7 CPU-s of a worker's 1.9 CPU-s start, for nothing a worker uses.
    requires_system_checks = [Tags.compatibility, Tags.models]

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--queue", default=None,
                            help="Queues in priority order, comma separated (default: "
                                 "JOBGUARD['DEFAULT_QUEUE']; '*': every other queue). With "
                                 "numbers (default:10,emails:4) each is the most jobs of "
                                 "that queue run at once and its weight in a fair round robin.")
        parser.add_argument("--sleep", type=float, default=3.0,
                            help="Seconds to wait when no job is due (PostgreSQL wakes on NOTIFY "
                                 "sooner).")
        parser.add_argument("--tries", type=int, default=1,
                            help="Attempts for jobs that do not set `tries` (0 = unlimited).")
        parser.add_argument("--timeout", type=float, default=None,
                            help="Seconds a job may run unless it sets `timeout` (default: "
                                 "JOBGUARD['DEFAULT_TIMEOUT']).")
        parser.add_argument("--backoff", type=_csv_floats, default=[0.0],
                            help="Seconds before retrying a job that raised, or a list per "
                                 "attempt (1,5,10).")
        parser.add_argument("--max-jobs", type=int, default=0,
                            help="Exit after this many jobs (0 = no limit).")
        parser.add_argument("--max-time", type=float, default=0,
                            help="Exit after this many seconds (0 = no limit).")
        parser.add_argument("--stop-timeout", type=float, default=0,
                            help="After SIGTERM or --max-time, interrupt jobs still running "
                                 "this many seconds later; they go back to the queue without "
                                 "using an attempt (0 = let them finish). Keep it below the "
                                 "time before SIGKILL.")
        parser.add_argument("--stop-when-empty", action="store_true",
                            help="Exit when no job is due.")
        parser.add_argument("--memory", type=int, default=128,
                            help="Exit (code 12) after a job when RSS is above this many MB.")
        parser.add_argument("--rest", type=float, default=0,
                            help="Seconds to rest after each job.")
        parser.add_argument("--once", action="store_true", help="Process one job and exit.")
        parser.add_argument("--batch", type=int, default=0,
                            help="Jobs to reserve per claim (default: "
                                 "JOBGUARD['CLAIM_BATCH_SIZE'], adaptive unless set: one "
                                 "without a backlog, up to 512 with one).")
        parser.add_argument("--concurrency", type=int, default=1,
                            help="Worker processes to run under one supervisor.")
        parser.add_argument("--async-concurrency", type=int, default=None,
                            help="Async jobs (async def handle) to run at once on the worker "
                                 "process's event loop (default: "
                                 "JOBGUARD['ASYNC_CONCURRENCY'], 10).")
        parser.add_argument("--threads", type=int, default=1,
                            help="Jobs each worker process runs at once, on threads (one "
                                 "database connection each).")
        parser.add_argument("--database", default=None,
                            help="Database alias holding the queue "
                                 "(default: JOBGUARD['DATABASE']).")
        parser.add_argument("--reload", action="store_true",
                            help="Restart the worker when its code changes (development, as "
                                 "runserver does); the running job finishes first.")
        parser.add_argument("--log-format", choices=logs.FORMATS, default=None,
                            help="How job lines are printed: text (the default) or json (one "
                                 "object per line). Without it they are printed only when "
                                 "the project's LOGGING does not show them already.")
        parser.add_argument("--metrics-port", type=int, default=None,
                            help="Serve this worker's Prometheus metrics (jobs by outcome, "
                                 "run times) on this port; one port for all --concurrency "
                                 "processes. Needs django-jobguard[metrics].")
        parser.add_argument("--metrics-address", default="127.0.0.1",
                            help="The address --metrics-port listens on (default 127.0.0.1: "
                                 "this machine only, as the metrics have no authentication; "
                                 "0.0.0.0 for every interface).")
        parser.add_argument("--reload-grace", type=float, default=5.0,
                            help="With --reload: seconds the running job may go on after a "
                                 "change before it goes back to the queue, its attempt unused.")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            entries = parse_queues(opts["queue"] or jobguard_settings.DEFAULT_QUEUE)
        except ValueError as exc:
            raise CommandError(f"--queue: {exc}.") from None
        for name in ("sleep", "max_time", "rest", "reload_grace", "stop_timeout"):
            if opts[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must not be negative.")
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1.")
        if opts["async_concurrency"] is not None and opts["async_concurrency"] < 1:
            raise CommandError("--async-concurrency must be at least 1.")
        if opts["threads"] < 1:
            raise CommandError("--threads must be at least 1.")
        if opts["reload"] and opts["threads"] > 1:
            raise CommandError("--reload runs one job at a time; leave out --threads.")
        if opts["reload"] and opts["concurrency"] > 1:
            raise CommandError("--reload runs one worker process; leave out --concurrency.")
        database = queue_database(opts["database"])
        for error in check_skip_locked(databases=[database]):
            raise CommandError(f"{error.msg} ({error.id})")
        missing = unapplied_migrations(database)
        if missing:
            raise CommandError(migrate_message(missing, database))
        options = WorkerOptions(
            queues=[entry.name for entry in entries], sleep=opts["sleep"], tries=opts["tries"],
            timeout=opts["timeout"],
            backoff=opts["backoff"], max_jobs=opts["max_jobs"], max_time=opts["max_time"],
            stop_when_empty=opts["stop_when_empty"], memory=opts["memory"], rest=opts["rest"],
            once=opts["once"], batch=opts["batch"], using=database,
            async_concurrency=opts["async_concurrency"],
            threads=opts["threads"], stop_timeout=opts["stop_timeout"],
            queue_limits={e.name: e.limit for e in entries if e.limit is not None},
        )
        port = opts["metrics_port"]
        if port is not None and not 0 <= port <= 65535:
            raise CommandError(f"--metrics-port must be a port number (0-65535), not {port}.")
        if port is not None:
            from django_jobguard.metrics import MetricsUnavailableError, require

            try:
                require()
            except MetricsUnavailableError as exc:
                raise CommandError(f"--metrics-port: {exc}") from None
        verbosity = opts["verbosity"]
        installed = logs.install_handler(verbosity, opts["log_format"], stream=self.stdout,
                                         style=self.style)
        try:
            line, about = startup(options, opts)
            logs.job_logger.info(line, extra=about)
            for warning in unseen_queues(options.queues, using=database):
                logs.job_logger.warning(warning)
            code = self._run(options, opts, verbosity)
        finally:
            if installed is not None:
                installed.remove()
        if code:
            sys.exit(code)

    def _run(self, options: WorkerOptions, opts: dict[str, Any], verbosity: int) -> int:
        if opts["reload"]:
            from django_jobguard.worker.reloader import run_with_reloader

            def make() -> Any:  # in the child process only: it serves the metrics
                self._serve_metrics(opts)
                return make_worker(options, verbosity=verbosity)

            return run_with_reloader(make, grace=opts["reload_grace"],
                                     write=lambda line: self._write(line, "RELOAD"))
        if opts["concurrency"] > 1:
            from django_jobguard.worker.supervisor import Supervisor

            server = self._serve_metrics(opts, multiprocess=True)
            try:
                return Supervisor(options, processes=opts["concurrency"], verbosity=verbosity,
                                  stdout=self.stdout, log_format=opts["log_format"],
                                  metrics=server).run()
            finally:
                if server is not None:
                    server.close()
        server = self._serve_metrics(opts)
        try:
            # (set by run_from_argv(), i.e. manage.py; not by call_command())
            own = bool(getattr(self, "_called_from_command_line", False))
            return run_worker_process(options, verbosity=verbosity, own_process=own)
        finally:
            if server is not None:
                server.close()

    def _serve_metrics(self, opts: dict[str, Any], *, multiprocess: bool = False) -> Any:
        """Start the ``--metrics-port`` server (and, in this process, the recording)."""
        if opts["metrics_port"] is None:
            return None
        from django_jobguard.metrics.server import MetricsServer

        try:
            server = MetricsServer(opts["metrics_port"], opts["metrics_address"],
                                   multiprocess=multiprocess)
        except OSError as exc:
            raise CommandError(f"--metrics-port {opts['metrics_port']}: {exc}") from None
        if not multiprocess:
            from django_jobguard.metrics.recording import start_recording

            start_recording()
        return server

    @functools.cached_property
    def _palette(self) -> dict[str, Callable[[str], str]]:
        """This command's style of each job line state (the log formatter's colours)."""
        return logs.palette(self.style)

    def _write(self, line: str, state: str) -> None:
        style = self._palette.get(state)
        self.stdout.write(style(line) if style else line)
        self.stdout.flush()

