"""``WithoutOverlapping``: at most one job per key runs at a time.

Return it from ``Job.middleware()``::

    def middleware(self):
        return [WithoutOverlapping(self.invoice_id, shared=True, expire_after=120)]

The lock ``jobguard:overlap:<job name>:<key>`` (``jobguard:overlap:<key>`` with ``shared``) is
taken when the job starts and released when ``handle()`` returns or raises. While another job
holds it, the job is deferred by ``release_after`` seconds (no attempt used unless
``JOBGUARD['DEFERRALS_CONSUME_ATTEMPTS']``), or dropped with ``dont_release`` (deleted, not
failed). The owner is the job id plus a random suffix per run, so a stale run can never release
a newer run's lock. ``expire_after`` bounds how long a killed worker keeps the lock; with
``renew=True`` a thread extends the lock while ``handle()`` runs, so ``expire_after`` can be
short without a long job losing it. ``job.lock_token`` is the lock's fencing token.
"""

from __future__ import annotations

import ast
import datetime
import enum
import inspect
import logging
import secrets
import textwrap
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_jobguard.middleware import JobMiddleware, Next
from django_jobguard.stores import Store, get_store

if TYPE_CHECKING:
    from django_jobguard.jobs import Job

logger = logging.getLogger("django_jobguard.overlap")

_warned_unbounded: set[str] = set()


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"WithoutOverlapping({name}=...) must be seconds >= 0, not {value!r}.")
    return float(value)


class WithoutOverlapping(JobMiddleware):
    """Run one job per ``key`` at a time; see the module docstring for the options."""

    def __init__(
        self,
        key: Any = "",
        *,
        release_after: float | datetime.timedelta = 0,
        expire_after: float | datetime.timedelta = 0,
        dont_release: bool = False,
        shared: bool = False,
        renew: bool = False,
        store: str | None = None,
    ) -> None:
        if isinstance(key, enum.Enum):
            key = key.value
        if not isinstance(key, (str, int, uuid.UUID)) or isinstance(key, bool):
            raise TypeError(f"WithoutOverlapping key must be a string, an int or a UUID, not "
                            f"{key!r}.")
        self.key = str(key)
        self.release_after = _seconds(release_after, "release_after")
        self.expire_after = _seconds(expire_after, "expire_after")
        self.dont_release = bool(dont_release)
        self.shared = bool(shared)
        self.renew = bool(renew)
        self.store = store
        if self.renew and not self.expire_after:
            raise ValueError("WithoutOverlapping(renew=True) needs expire_after > 0: renewal "
                             "keeps extending a lock that would otherwise expire.")

    def __repr__(self) -> str:
        return (f"WithoutOverlapping({self.key!r}, release_after={self.release_after:g}, "
                f"expire_after={self.expire_after:g}, dont_release={self.dont_release}, "
                f"shared={self.shared}, renew={self.renew})")

    def lock_key(self, job: Job) -> str:
        """``jobguard:overlap:<job name>:<key>``, or ``jobguard:overlap:<key>`` when shared."""
        return f"jobguard:overlap:{self.key}" if self.shared else \
            f"jobguard:overlap:{job.name}:{self.key}"

    def handle(self, job: Job, next: Next) -> Any:
        store = get_store(self.store)
        key = self.lock_key(job)
        owner = f"{job.job_id or 'sync'}:{secrets.token_hex(8)}"
        token = store.acquire(key, owner, ttl=self.expire_after or None,
                              job_id=job.job_id or "")
        if token is None:
            if not self.dont_release:
                job.defer(self.release_after, reason="overlap")
            return None  # dropped: deleted as done, not failed
        if not self.expire_after and job.name not in _warned_unbounded:
            _warned_unbounded.add(job.name)
            logger.warning("%s runs WithoutOverlapping(%r) without expire_after: a worker "
                           "killed while running it keeps the lock until someone force-releases "
                           "it (manage.py jobs_locks --release).", job.name, self.key)
        job.lock_token = token
        renewer = _Renewer(store, key, owner, self.expire_after, job.name) if self.renew \
            else None
        try:
            return next(job)
        finally:
            if renewer is not None:
                renewer.stop()
            try:
                store.release(key, owner)
            except Exception:
                logger.exception("Could not release overlap lock %s; it stays until it "
                                 "expires.", key)


class _Renewer:
    """A daemon thread that extends one lock every third of its ttl until stopped."""

    def __init__(self, store: Store, key: str, owner: str, ttl: float, job_name: str) -> None:
        self.store, self.key, self.owner, self.ttl, self.job_name = (store, key, owner, ttl,
                                                                     job_name)
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"jobguard-renew:{key}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(max(self.ttl / 3, 0.05)):
                try:
                    if not self.store.extend(self.key, self.owner, ttl=self.ttl):
                        self.lost = True
                        logger.warning("%s lost its overlap lock %s before renewing it; another "
                                       "job may hold it now (use job.lock_token to fence "
                                       "writes).", self.job_name, self.key)
                        return
                except Exception as exc:
                    logger.warning("Renewing overlap lock %s failed (%s); retrying.", self.key,
                                   exc)
        finally:
            connections.close_all()  # this thread's own database connections

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- the decorator for function jobs ----------------------------------------------------------


class _OverlapFactory:
    """Builds a ``WithoutOverlapping`` per run from the function job's arguments."""

    def __init__(self, key: Callable[..., Any] | None, options: dict[str, Any]) -> None:
        self.key = key
        self.options = options
        WithoutOverlapping("", **options)  # validate the options now, at import time

    @property
    def expire_after(self) -> float:
        return _seconds(self.options.get("expire_after", 0), "expire_after")

    def __call__(self, job: Any) -> WithoutOverlapping:
        key = self.key(*job.args, **job.kwargs) if self.key is not None else ""
        return WithoutOverlapping(key, **self.options)


def without_overlapping(
    func: Any = None,
    *,
    key: Callable[..., Any] | None = None,
    **options: Any,
) -> Any:
    """``WithoutOverlapping`` for a function job; stack it with ``@job`` in either order::

        @without_overlapping(key=lambda invoice_id: invoice_id, shared=True, expire_after=60)
        @job
        def charge_invoice(invoice_id): ...

    ``key`` gets the job's arguments and returns the overlap key (default: one at a time for
    the whole job); the other options are ``WithoutOverlapping``'s.
    """
    from django_jobguard.jobs import extend_function_job

    if key is not None and not callable(key):
        raise TypeError(f"@without_overlapping(key=...) takes a function of the job's "
                        f"arguments, not {key!r}.")
    factory = _OverlapFactory(key, options)

    def decorate(target: Any) -> Any:
        return extend_function_job(target, middleware=factory)

    return decorate(func) if func is not None else decorate


# -- finding jobs whose overlap lock never expires (system check jobguard.W002) ---------------

_source_cache: dict[Any, bool] = {}


def _unbounded_in_source(function: Any) -> bool:
    """Whether ``function``'s source builds ``WithoutOverlapping(...)`` without an
    ``expire_after`` (or with a literal 0). Only literal calls are seen; anything dynamic
    (a variable, ``**options``, a helper function) is given the benefit of the doubt."""
    if function in _source_cache:
        return _source_cache[function]
    found = False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name != "WithoutOverlapping":
            continue
        keywords = {kw.arg: kw.value for kw in node.keywords}
        if None in keywords:  # **options: cannot tell
            continue
        value = keywords.get("expire_after")
        if value is None or (isinstance(value, ast.Constant) and not value.value):
            found = True
            break
    _source_cache[function] = found
    return found


def has_unbounded_overlap(job_class: type) -> bool:
    """True when ``job_class`` (as far as can be told without running it) uses
    ``WithoutOverlapping`` with no ``expire_after``."""
    for factory in getattr(job_class, "middleware_factories", None) or ():
        if isinstance(factory, _OverlapFactory) and not factory.expire_after:
            return True
    from django_jobguard.jobs import FunctionJob, Job

    method = getattr(job_class, "middleware", None)
    function = getattr(method, "__func__", method)
    if function in (Job.middleware, FunctionJob.middleware, None):
        return False
    return _unbounded_in_source(function)
