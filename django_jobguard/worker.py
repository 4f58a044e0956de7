"""The worker: claim jobs, run each through its pipeline, ack, release or fail it.

One job's path, top to bottom (:meth:`Worker.process`):

1. rebuild the job from its row (unknown name / corrupt payload / missing model → failed);
2. fail it if it already used its attempts (or its ``retry_until`` passed);
3. run middleware and ``handle()`` under the job's timeout (a ``ShouldBeUniqueUntilProcessing``
   lock is released once every middleware let the job through, just before ``handle()``);
4. the outcome decides: ack (and release the unique lock), release back to the queue
   (``job.release()``, a middleware deferral, a store outage before ``handle()``, or an
   exception with tries left), or fail.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections
from django.db.models import Value
from django.db.models.functions import Now
from django.utils import timezone

from django_jobguard import queue, registry, results, signals, unique
from django_jobguard.conf import jobguard_settings
from django_jobguard.exceptions import (
    JobTimeoutError,
    MaxAttemptsExceededError,
    PayloadError,
    StoreUnavailableError,
)
from django_jobguard.jobs import Job
from django_jobguard.models import QueuedJob
from django_jobguard.models import Worker as WorkerRow
from django_jobguard.serialization import MissingModelError, payload_size

logger = logging.getLogger("django_jobguard.worker")

EXIT_OK = 0
EXIT_MEMORY = 12

#: A job stopped by a store outage before ``handle()`` comes back after this many seconds, plus
#: up to ``STORE_OUTAGE_JITTER`` (so that the jobs put back together do not all return at once).
STORE_OUTAGE_DELAY = 2.0
STORE_OUTAGE_JITTER = 3.0
#: Seconds the worker then waits before its next job, so it does not spin through the queue
#: putting back job after job while the store restarts.
STORE_OUTAGE_PAUSE = 1.0


@dataclass
class WorkerOptions:
    """What ``manage.py jobworker`` passes to :class:`Worker` (``queue:work``'s options)."""

    queues: list[str] = field(default_factory=lambda: [jobguard_settings.DEFAULT_QUEUE])
    sleep: float = 3.0
    tries: int = 1
    timeout: float | None = None
    backoff: list[float] = field(default_factory=lambda: [0.0])
    max_jobs: int = 0
    max_time: float = 0.0
    stop_when_empty: bool = False
    memory: int = 128
    rest: float = 0.0
    once: bool = False
    batch: int = 0
    using: str = DEFAULT_DB_ALIAS


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1_048_576
    except OSError:  # not Linux: peak RSS is the best we have
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _retry_until(row: QueuedJob) -> datetime.datetime | None:
    value = row.payload.get("retry_until") if isinstance(row.payload, dict) else None
    return datetime.datetime.fromisoformat(value) if value else None


def _seconds(delay: Any) -> float:
    if isinstance(delay, datetime.datetime):
        return max((delay - timezone.now()).total_seconds(), 0.0)
    if isinstance(delay, datetime.timedelta):
        return delay.total_seconds()
    return float(delay or 0)


class RecentOutcomes:
    """Finished and failed jobs of the last ``window`` seconds (written at each heartbeat).

    Kept as one ``[second, done, failed]`` bucket per second, so memory stays at most
    ``window`` buckets however many jobs a second the worker runs (one entry per job grew a
    busy worker by megabytes a minute).
    """

    DONE = frozenset({"DONE", "SKIPPED", "DELETED"})

    def __init__(self, window: int = 60, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._buckets: deque[list[int]] = deque()
        self._lock = threading.Lock()

    def record(self, state: str) -> None:
        failed = state == "FAILED"
        if not failed and state not in self.DONE:
            return
        second = int(self._clock())
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != second:
                self._buckets.append([second, 0, 0])
                self._drop_old(second)
            self._buckets[-1][2 if failed else 1] += 1

    def counts(self) -> tuple[int, int]:
        """``(done, failed)`` within the window (to the second)."""
        with self._lock:
            self._drop_old(int(self._clock()))
            return (sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets))

    def _drop_old(self, second: int) -> None:
        while self._buckets and self._buckets[0][0] <= second - self.window:
            self._buckets.popleft()

    def __len__(self) -> int:
        """How many buckets are kept (at most ``window``)."""
        return len(self._buckets)


class Worker:
    """Runs jobs from ``options.queues`` until told to stop."""

    def __init__(self, options: WorkerOptions | None = None, *,
                 log: Callable[[str, str], None] | None = None,
                 log_running: bool = True) -> None:
        self.options = options or WorkerOptions()
        # Whether ``log`` wants RUNNING lines: the line is not even built otherwise.
        self._log_running = log_running
        self._stamp: tuple[int, str] = (-1, "")
        self._rss_checked = -1.0
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.log = log or (lambda line, state: None)
        self.jobs_processed = 0
        self._stop = threading.Event()
        self._in_job = False
        self._current_job = ""
        self._listener: queue.Listener | None = None
        self._listener_lost_at: float | None = None
        # Rows claimed and not yet finished: the only leases the heartbeat renews. A row whose
        # ack or release failed (database error) drops out, so its lease runs out and another
        # worker retries it, instead of this worker renewing it for the rest of its life.
        self._held: frozenset[Any] = frozenset()
        self._heartbeat: threading.Thread | None = None
        self._recent = RecentOutcomes()

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Process jobs until a stop condition; returns the process exit code."""
        self._install_signal_handlers()
        self._start()
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                rows = self._claim()
                self._held = frozenset(row.id for row in rows)
                for index, row in enumerate(rows):
                    if self._stop.is_set():  # asked to stop: give back what we did not start
                        for left in rows[index:]:
                            queue.release(left, count_attempt=False, using=self.options.using)
                        self._held = frozenset()
                        break
                    self._process_safely(row)
                    self._held = self._held - {row.id}
                    if self.options.rest:
                        time.sleep(self.options.rest)
                code = self._stop_code(found=bool(rows), started=started)
                if code is not None:
                    return code
                if not rows:
                    self._wait()
            return EXIT_OK
        finally:
            self._shutdown()

    def _stop_code(self, *, found: bool, started: float) -> int | None:
        """``queue:work``'s stop checks, in its order; ``None`` means keep going."""
        o = self.options
        if self._stop.is_set():
            return EXIT_OK
        if o.memory and self._memory_exceeded(o.memory):
            logger.warning("Worker %s uses more than %s MB; exiting.", self.id, o.memory)
            return EXIT_MEMORY
        if o.once or (o.stop_when_empty and not found):
            return EXIT_OK
        if o.max_time and time.monotonic() - started >= o.max_time:
            return EXIT_OK
        if o.max_jobs and self.jobs_processed >= o.max_jobs:
            return EXIT_OK
        return None

    def _memory_exceeded(self, limit_mb: int) -> bool:
        """RSS above ``limit_mb``; read at most twice a second (it costs a file read)."""
        now = time.monotonic()
        if now - self._rss_checked < 0.5:
            return False
        self._rss_checked = now
        return _rss_mb() >= limit_mb

    def _claim(self) -> list[QueuedJob]:
        o = self.options
        limit = 1 if o.once else (o.batch or jobguard_settings.CLAIM_BATCH_SIZE)
        if o.max_jobs:
            limit = max(1, min(limit, o.max_jobs - self.jobs_processed))
        try:
            return queue.claim(o.queues, worker_id=self.id, limit=limit, using=o.using)
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("Claim failed (%s); reconnecting in 1 s.", exc)
            self._reset_connections(force=True)
            self._stop.wait(1)
            return []

    def _wait(self) -> None:
        """Idle until ``--sleep`` passes, the next delayed job is due, a NOTIFY arrives
        (PostgreSQL) or a stop signal."""
        deadline = time.monotonic() + min(self.options.sleep, self._until_next_due())
        self._reopen_listener()
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            chunk = min(remaining, 1.0)
            if self._listener is not None:
                try:
                    if self._listener.wait(chunk):
                        return
                except Exception as exc:  # lost connection: fall back to polling
                    logger.warning("LISTEN connection lost (%s); polling until it is back.",
                                   exc)
                    self._listener.close()
                    self._listener = None
                    self._listener_lost_at = time.monotonic()
            else:
                self._stop.wait(chunk)

    def _reopen_listener(self, retry_every: float = 5.0) -> None:
        """LISTEN again a while after the listening connection was lost (server restart,
        ``pg_terminate_backend``), so the worker does not poll for the rest of its life."""
        lost = self._listener_lost_at
        if self._listener is not None or lost is None or time.monotonic() - lost < retry_every:
            return
        try:
            self._listener = queue.Listener.open(self.options.using)
            self._listener_lost_at = None
        except Exception as exc:
            logger.warning("LISTEN still unavailable (%s); polling.", exc)
            self._listener_lost_at = time.monotonic()

    def _until_next_due(self) -> float:
        """Seconds until the earliest delayed or leased job in our queues becomes due, by the
        database clock (a worker whose own clock runs ahead would otherwise poll in a loop)."""
        try:
            wait = queue.seconds_until_due(self.options.queues, using=self.options.using)
        except (DatabaseError, InterfaceError):
            return self.options.sleep
        if wait is None:
            return self.options.sleep
        return max(wait, 0.01)

    # -- one job -----------------------------------------------------------------------

    def _process_safely(self, row: QueuedJob) -> None:
        """Run :meth:`process`; a database error leaves the row to lease recovery."""
        self._in_job = True
        self._current_job = str(row.id)
        try:
            self._recent.record(self.process(row))
        except (DatabaseError, InterfaceError) as exc:
            logger.exception("Database error while finishing %s; its lease will expire and "
                             "it will be retried.", row, exc_info=exc)
        except Exception as exc:  # a store or signal receiver failed outside the job
            logger.exception("Error while finishing %s; if it was not acked its lease will "
                             "expire and it will be retried.", row, exc_info=exc)
            self._stop.wait(1)  # back off: the failing service may be restarting
        finally:
            self._in_job = False
            self._current_job = ""
            self.jobs_processed += 1
            self._reset_connections()

    def process(self, row: QueuedJob) -> str:
        """Run one claimed job to its outcome; returns the state logged (DONE, FAILED, …)."""
        started = time.monotonic()
        try:
            job = self._rebuild(row)
        except MissingModelError as exc:
            if getattr(registry.get(row.name), "delete_when_missing_models", False):
                queue.ack(row, using=self.options.using)
                unique.release(row.payload)
                return self._log(row, "DELETED", started, str(exc))
            return self._fail(row, None, exc, started)
        except Exception as exc:
            return self._fail(row, None, exc, started)

        tries = self._tries(job)
        deadline = _retry_until(row)
        exceeded = (timezone.now() > deadline) if deadline else (0 < tries < row.attempts)
        if exceeded:
            detail = f" Last error: {row.last_error}" if row.last_error else ""
            error = MaxAttemptsExceededError(
                f"{row.name} has been attempted too many times "
                f"({row.attempts - 1} of {tries if not deadline else 'until ' + str(deadline)})."
                f"{detail}"
            )
            return self._fail(row, job, error, started)

        if self._log_running:
            self.log(self._line(row, "RUNNING"), "RUNNING")
        signals.job_processing.send(sender=type(job), job=job, job_id=job.job_id)
        job_started_at = timezone.now()
        try:
            with self._time_limit(self._timeout(job),
                                  finished=lambda: job._handle_finished):
                result = job._run()
        except Exception as exc:
            if isinstance(exc, StoreUnavailableError) and not job._handled:
                return self._after_store_outage(row, job, exc, started)
            return self._after_exception(row, job, exc, started, deadline, tries)

        if job._failed is not None:
            return self._fail(row, job, job._failed, started)
        if job._released is not None:
            delay, counts, reason = job._released
            return self._release(row, job, started, delay=_seconds(delay),
                                 count_attempt=counts, reason=reason)
        if not queue.ack(row, using=self.options.using):
            return self._log(row, "LOST", started, "lease expired; another worker has it")
        unique.release(row.payload)  # logs, never raises, if the store is down
        if job.keep_result:
            self._store_result(row, "SUCCESSFUL", job_started_at, ran=job._handled,
                               return_value=result)
        signals.job_processed.send(sender=type(job), job=job, job_id=job.job_id, result=result)
        return self._log(row, "DONE" if job._handled else "SKIPPED", started)

    def _rebuild(self, row: QueuedJob) -> Job:
        job_class = registry.get(row.name)
        if not isinstance(row.payload, dict):
            raise PayloadError(f"Corrupt payload for {row.name}: expected a JSON object, got "
                               f"{type(row.payload).__name__}.")
        limit = jobguard_settings.MAX_PAYLOAD_BYTES
        # A row written around dispatch() may be over the limit. The claim knows the length
        # of the stored text; encoded for the limit a character takes at most 6 bytes
        # (\uXXXX), so only a long text needs the exact size.
        text_length = getattr(row, "payload_text_length", None)
        if limit and (text_length is None or text_length * 6 > limit) and (
                size := payload_size(row.payload)) > limit:
            raise PayloadError(f"Payload of {row.name} is {size} bytes, over "
                               f"JOBGUARD['MAX_PAYLOAD_BYTES'] = {limit}.")
        try:
            job = job_class.from_payload(row.payload)
        except MissingModelError:
            raise
        except (TypeError, ValueError, KeyError, LookupError) as exc:
            raise PayloadError(f"Cannot rebuild {row.name} from its payload: {exc}") from exc
        job.job_id = str(row.id)
        job._attempts = row.attempts
        job._worker = self
        return job

    def _tries(self, job: Job) -> int:
        return self.options.tries if job.tries is None else job.tries

    def _timeout(self, job: Job) -> float:
        if job.timeout is not None:
            return float(job.timeout)
        if self.options.timeout is not None:
            return float(self.options.timeout)
        return float(jobguard_settings.DEFAULT_TIMEOUT)

    def _backoff(self, job: Job, attempts: int) -> float:
        steps = self.options.backoff if job.backoff is None else job.backoff
        if not isinstance(steps, (list, tuple)):
            steps = [steps]
        if not steps:
            return 0.0
        return float(steps[min(max(attempts, 1), len(steps)) - 1])

    def _after_exception(self, row: QueuedJob, job: Job, exc: Exception, started: float,
                         deadline: datetime.datetime | None, tries: int) -> str:
        """Retry with backoff, or fail on the last attempt / too many exceptions."""
        exceptions = row.exceptions + 1
        if job._failed is not None or isinstance(exc, JobTimeoutError) and job.fail_on_timeout:
            final = True
        elif deadline is not None:
            final = timezone.now() >= deadline
        else:
            final = 0 < tries <= row.attempts
        if job.max_exceptions and exceptions >= job.max_exceptions:
            final = True
        if final:
            return self._fail(row, job, exc, started)
        logger.info("%s [%s] raised %r; retrying.", row.name, row.id, exc)
        return self._release(row, job, started, delay=self._backoff(job, row.attempts),
                             count_attempt=True, reason="exception", exception=exc)

    def _after_store_outage(self, row: QueuedJob, job: Job, exc: StoreUnavailableError,
                            started: float) -> str:
        """A store could not be reached before ``handle()`` started: the job never ran, so
        put it back without using an attempt (whatever ``DEFERRALS_CONSUME_ATTEMPTS`` says),
        and pause before the next job. The outage is not the job's exception: it neither
        counts towards ``max_exceptions`` nor becomes ``last_error``."""
        delay = STORE_OUTAGE_DELAY + random.uniform(0, STORE_OUTAGE_JITTER)
        logger.warning("Store %r is unavailable (%s); %s [%s] goes back to the queue for "
                       "%.1f s without using an attempt.", exc.store, exc.error, row.name,
                       row.id, delay)
        state = self._release(row, job, started, delay=delay, count_attempt=False,
                              reason="store_unavailable")
        self._stop.wait(STORE_OUTAGE_PAUSE)
        return state

    def _release(self, row: QueuedJob, job: Job, started: float, *, delay: float,
                 count_attempt: bool, reason: str, exception: Exception | None = None) -> str:
        if not queue.release(row, delay=delay, count_attempt=count_attempt, exception=exception,
                             using=self.options.using):
            return self._log(row, "LOST", started, "lease expired; another worker has it")
        if job.keep_result:
            results.mark_ready(row, worker_id=self.id, ran=job._handled, exception=exception,
                               using=self.options.using)
        signals.job_released.send(sender=type(job), job=job, job_id=job.job_id, delay=delay,
                                  reason=reason, exception=exception)
        return self._log(row, "RELEASED", started, f"{reason}, retry in {delay:g} s")

    def _fail(self, row: QueuedJob, job: Job | None, exc: BaseException, started: float) -> str:
        if queue.fail(row, exc, using=self.options.using) is None:
            return self._log(row, "LOST", started, "lease expired; another worker has it")
        unique.release(row.payload)
        if job is None or job.keep_result:  # no job: a result row may exist (django.tasks)
            self._store_result(row, "FAILED", None, exception=exc,
                               ran=job is not None and job._handled, only_existing=job is None)
        if job is not None:
            try:
                job.failed(exc)
            except Exception:
                logger.exception("%s.failed() raised.", row.name)
        signals.job_failed.send(sender=type(job) if job else None, job=job, job_id=str(row.id),
                                exception=exc)
        logger.error("%s [%s] failed: %s", row.name, row.id, queue.describe(exc),
                     exc_info=(type(exc), exc, exc.__traceback__))
        return self._log(row, "FAILED", started, queue.describe(exc))

    def _store_result(self, row: QueuedJob, status: str, started_at: Any, *, ran: bool,
                      return_value: Any = None, exception: BaseException | None = None,
                      only_existing: bool = False) -> None:
        """Record the outcome in the job's result row (jobs with ``keep_result``)."""
        results.mark_finished(row, status=status, worker_id=self.id, ran=ran,
                              started_at=started_at, return_value=return_value,
                              exception=exception, only_existing=only_existing,
                              using=self.options.using)

    # -- timeouts, signals, logging ----------------------------------------------------

    @contextmanager
    def _time_limit(self, seconds: float, *,
                    finished: Callable[[], bool] = lambda: False) -> Iterator[None]:
        """Raise :class:`JobTimeoutError` in the job after ``seconds`` (main thread only).

        Once ``finished()`` (``handle()`` has returned or raised) the time is not up for the
        job any more: raising then would only interrupt the middleware's clean-up (an overlap
        lock left until it expires, a completed run retried). If the job swallows the error,
        or the clean-up hangs, the process exits after a grace period; the supervisor starts
        a new worker and the job's lease brings it back.
        """
        if not seconds or threading.current_thread() is not threading.main_thread():
            yield
            return
        fired = False

        def on_alarm(signum: int, frame: Any) -> None:
            nonlocal fired
            if fired:
                logger.critical("The job did not end within its timeout and a grace period; "
                                "exiting the worker process.")
                os._exit(1)
            fired = True
            signal.setitimer(signal.ITIMER_REAL, max(5.0, seconds))  # grace period
            if finished():
                logger.warning("The job's time ran out after handle() finished; letting its "
                               "middleware finish.")
                return
            raise JobTimeoutError(f"The job has timed out after {seconds:g} s.")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_stop(signum: int, frame: Any) -> None:
            logger.info("Worker %s got %s; finishing the current job.", self.id,
                        signal.Signals(signum).name)
            self._stop.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)

    def stop(self) -> None:
        """Ask the worker to exit after the current job."""
        self._stop.set()

    def _line(self, row: QueuedJob, state: str, elapsed: float | None = None,
              detail: str = "") -> str:
        second = int(time.time())
        if self._stamp[0] != second:  # formatting the local time once a second is enough
            self._stamp = (second, timezone.localtime().strftime("%Y-%m-%d %H:%M:%S"))
        head = f"{self._stamp[1]} {row.name} [{row.id}] "
        tail = f" {state}" + (f" {elapsed * 1000:.0f} ms" if elapsed is not None else "")
        line = head + "." * max(3, 100 - len(head) - len(tail)) + tail
        return f"{line} ({detail})" if detail else line

    def _log(self, row: QueuedJob, state: str, started: float, detail: str = "") -> str:
        self.log(self._line(row, state, time.monotonic() - started, detail), state)
        return state

    # -- start-up, heartbeat, shutdown -----------------------------------------------

    def _start(self) -> None:
        o = self.options
        WorkerRow.objects.using(o.using).update_or_create(
            id=self.id,
            defaults={"hostname": socket.gethostname(), "pid": os.getpid(),
                      "queues": ",".join(o.queues)},
        )
        if not o.once and jobguard_settings.USE_NOTIFY:
            self._listener = queue.Listener.open(o.using)
        self._heartbeat = threading.Thread(target=self._beat, name="jobguard-heartbeat",
                                           daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        """Every few seconds: renew the leases this worker holds and say it is alive."""
        interval = max(0.5, min(float(jobguard_settings.RETRY_AFTER) / 3, 15.0))
        using = self.options.using
        last_clean = time.monotonic()
        try:
            while not self._stop.wait(interval):
                try:
                    self.heartbeat()
                    if time.monotonic() - last_clean > 60:
                        self._clean_up(using)
                        last_clean = time.monotonic()
                except Exception as exc:
                    logger.warning("Heartbeat failed (%s); retrying.", exc)
                    self._reset_connections(force=True)
        finally:
            connections.close_all()

    def heartbeat(self) -> None:
        """Renew this worker's leases and write its liveness and last-minute counts."""
        using = self.options.using
        held = self._held
        if held:
            queue.extend_leases(self.id, ids=held, using=using)
        done, failed = self._recent.counts()
        WorkerRow.objects.using(using).filter(id=self.id).update(
            last_seen_at=Now(), jobs_processed=self.jobs_processed,
            current_job=self._current_job, done_last_minute=done,
            failed_last_minute=failed)

    @staticmethod
    def _clean_up(using: str) -> None:
        """Housekeeping any live worker may do: expired locks, workers that stopped beating."""
        from django_jobguard.stores import get_store

        get_store().clean_expired()
        get_store().clean_expired_throttles()
        if jobguard_settings.RESULT_RETENTION_DAYS:
            results.prune(older_than=datetime.timedelta(
                days=float(jobguard_settings.RESULT_RETENTION_DAYS)), using=using)
        gone = Now() - Value(datetime.timedelta(seconds=10 * float(jobguard_settings.RETRY_AFTER)))
        WorkerRow.objects.using(using).filter(last_seen_at__lt=gone).delete()

    def _shutdown(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
        try:
            WorkerRow.objects.using(self.options.using).filter(id=self.id).delete()
        except (DatabaseError, InterfaceError):
            pass

    @staticmethod
    def _reset_connections(force: bool = False) -> None:
        """Drop connections a job broke (or all, after an error) so the next query reconnects."""
        for conn in connections.all(initialized_only=True):
            if conn.in_atomic_block:
                continue  # the caller's transaction (tests running a worker in-process)
            if force or (conn.errors_occurred and not conn.is_usable()):
                conn.close()


def run_worker(queues: Sequence[str], **options: Any) -> int:
    """Run a worker in this thread (tests, scripts): ``run_worker(["default"], once=True)``."""
    return Worker(WorkerOptions(queues=list(queues), **options)).run()
