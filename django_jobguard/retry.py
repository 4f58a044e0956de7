"""The retry policy: how many runs a job gets, how long it waits between them, when it fails.

One :class:`RetryPolicy` is built per run from the job (its class attributes, or what its
constructor set) over the worker's options (``--tries``, ``--timeout``, ``--backoff``), and the
``retry_until`` deadline dispatch stored. The pipeline and every middleware that asks "is this
the last attempt?" ask it here, so the rule exists once.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from django_jobguard import clock, durations
from django_jobguard.conf import jobguard_settings


@dataclass(frozen=True)
class Defaults:
    """The worker's options for jobs that do not set their own (``queue:work``'s flags)."""

    tries: int = 1
    timeout: float | None = None  # None = JOBGUARD['DEFAULT_TIMEOUT']
    backoff: tuple[float, ...] = (0.0,)


@dataclass(frozen=True)
class RetryPolicy:
    """The effective retry rules of one job run."""

    #: Runs allowed; 0 = unlimited (then ``retry_until`` or ``max_exceptions`` ends it).
    tries: int = 1
    #: Fail once this many exceptions reached the worker, even if tries remain.
    max_exceptions: int | None = None
    #: Seconds before retry ``n`` (1-based); the last step repeats.
    backoff: tuple[float, ...] = (0.0,)
    #: A deadline instead of ``tries``: retry until then.
    retry_until: datetime.datetime | None = None
    #: Seconds a run may take; 0 = no limit.
    timeout: float = 0.0
    #: A timeout fails the job at once instead of retrying it.
    fail_on_timeout: bool = False

    @classmethod
    def for_job(cls, job: Any, *, defaults: Defaults | None = None,
                retry_until: datetime.datetime | None = None) -> RetryPolicy:
        """The policy of ``job``: its own settings, else the worker's ``defaults`` (built once
        per distinct set of them: a worker runs the same few classes again and again)."""
        defaults = defaults or _DEFAULTS
        backoff = job.backoff
        key = (job.name, job.tries, job.max_exceptions,
               tuple(backoff) if isinstance(backoff, list) else backoff, job.timeout,
               job.fail_on_timeout, retry_until, defaults, jobguard_settings.DEFAULT_TIMEOUT)
        try:
            return _policies[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable setting: built every time
            return cls._build(job, defaults, retry_until)
        if len(_policies) >= _POLICIES_MAX:
            _policies.clear()
        policy = _policies[key] = cls._build(job, defaults, retry_until)
        return policy

    @classmethod
    def _build(cls, job: Any, defaults: Defaults,
               retry_until: datetime.datetime | None) -> RetryPolicy:
        timeout = job.timeout if job.timeout is not None else defaults.timeout
        if timeout is None:
            timeout = jobguard_settings.DEFAULT_TIMEOUT
        backoff = defaults.backoff if job.backoff is None else job.backoff
        return cls(
            tries=defaults.tries if job.tries is None else job.tries,
            max_exceptions=job.max_exceptions or None,
            backoff=durations.seconds_list(backoff, name=f"{job.name}.backoff") or (0.0,),
            retry_until=retry_until,
            timeout=float(timeout or 0),
            fail_on_timeout=bool(job.fail_on_timeout),
        )

    def backoff_for(self, attempt: int) -> float:
        """Seconds to wait before running again after attempt ``attempt`` raised."""
        return self.backoff[min(max(attempt, 1), len(self.backoff)) - 1]

    def out_of_attempts(self, attempt: int, now: datetime.datetime | None = None) -> str:
        """Why a job taken again may not run, or ``""`` when it may: its deadline passed, or
        this would be run ``tries + 1`` (the run before was released, or its worker died).
        ``now`` defaults to :func:`clock.now`, read only for a deadline (every job asks)."""
        if self.retry_until is not None:
            now = clock.now() if now is None else now
            return f"retry deadline {when(self.retry_until, now)} passed" \
                if now > self.retry_until else ""
        if 0 < self.tries < attempt:
            return f"{attempt - 1} of {self.tries} tries used"
        return ""

    def is_last_attempt(self, attempt: int, now: datetime.datetime) -> bool:
        """An exception now ends the job: its deadline has come, or (without one) this is its
        last try."""
        if self.retry_until is not None:
            return now >= self.retry_until
        return 0 < self.tries <= attempt

    def ends_on(self, *, timed_out: bool, attempt: int, exceptions: int,
                now: datetime.datetime) -> str:
        """Which limit ends the job now that a run raised (``exceptions`` counts this one), or
        ``""`` when it is retried."""
        if timed_out and self.fail_on_timeout:
            return f"timed out after {self.timeout:g} s (fail_on_timeout)"
        if self.max_exceptions and exceptions >= self.max_exceptions:
            return f"{exceptions} exceptions reached its max_exceptions of {self.max_exceptions}"
        if not self.is_last_attempt(attempt, now):
            return ""
        what = "timed out" if timed_out else "raised"
        if self.retry_until is not None:
            return f"{what} after its retry deadline {when(self.retry_until, now)}"
        return f"its last try ({attempt} of {self.tries}) {what}"


def when(moment: datetime.datetime, now: datetime.datetime) -> str:
    """``11:43:09 UTC`` (today) or ``2026-12-03 11:43:09 UTC``, for messages."""
    moment = moment.astimezone(datetime.UTC)
    same_day = moment.date() == now.astimezone(datetime.UTC).date()
    return moment.strftime("%H:%M:%S UTC" if same_day else "%Y-%m-%d %H:%M:%S UTC")


_DEFAULTS = Defaults()
#: Policies by what they were built from (:meth:`RetryPolicy.for_job`); emptied when full.
_policies: dict[tuple[Any, ...], RetryPolicy] = {}
_POLICIES_MAX = 512
