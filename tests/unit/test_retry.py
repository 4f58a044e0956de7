"""django_jobguard.retry: the policy of one run (tries, max_exceptions, backoff, retry_until,
timeout) and its answers to "may it run again?" and "does this exception end it?".

The whole path through a worker is covered by the feature tests, not repeated here:
tests/unit/test_worker.py (``test_backoff_list_is_per_attempt_and_the_last_value_repeats``,
``test_unlimited_tries_and_max_exceptions``, ``test_retry_until_overrides_tries``,
``test_release_counts_an_attempt_and_fails_at_pop_with_max_attempts_exceeded``,
``test_fail_on_timeout``) and tests/unit/test_failure_reasons.py (the ``reason`` of each
failed job). Here: the rules themselves, at their boundaries, and how the policy is built
from the job and the worker's options. The policy has no jitter of its own (``RateLimited``
adds jitter to its delays: tests/unit/middleware/test_rate_limited.py).
"""

from __future__ import annotations

import datetime

import pytest
from django.test import override_settings

from django_jobguard import Job
from django_jobguard.retry import Defaults, RetryPolicy, when
from django_jobguard.worker import Worker, WorkerOptions

UTC = datetime.UTC
NOON = datetime.datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
SECOND = datetime.timedelta(seconds=1)


class Configurable(Job):
    """Not registered; each test sets what it needs through the default constructor."""

    abstract = True

    def handle(self):
        return None


# -- built from the job and the worker's options --------------------------------------------


def test_a_job_that_sets_nothing_gets_the_workers_defaults():
    policy = RetryPolicy.for_job(Configurable(),
                                 defaults=Defaults(tries=4, timeout=7, backoff=(5.0, 50.0)))
    assert (policy.tries, policy.timeout, policy.backoff) == (4, 7.0, (5.0, 50.0))
    assert policy.max_exceptions is None and policy.retry_until is None
    assert not policy.fail_on_timeout


def test_without_defaults_a_job_gets_one_try_no_backoff_and_the_default_timeout():
    with override_settings(JOBGUARD={"DEFAULT_TIMEOUT": 42}):
        policy = RetryPolicy.for_job(Configurable())
    assert (policy.tries, policy.backoff, policy.timeout) == (1, (0.0,), 42.0)


def test_the_jobs_own_settings_win_over_the_workers():
    job = Configurable(tries=0, max_exceptions=3, backoff=[1, datetime.timedelta(minutes=1)],
                       timeout=0, fail_on_timeout=True)
    deadline = NOON + datetime.timedelta(hours=1)
    policy = RetryPolicy.for_job(job, defaults=Defaults(tries=9, timeout=60, backoff=(2.0,)),
                                 retry_until=deadline)
    assert policy.tries == 0  # unlimited, not the worker's 9
    assert policy.max_exceptions == 3
    assert policy.backoff == (1.0, 60.0)
    assert policy.timeout == 0.0  # no limit, not the worker's 60 s
    assert policy.fail_on_timeout and policy.retry_until == deadline


def test_backoff_may_be_one_number_and_an_empty_list_means_none():
    assert RetryPolicy.for_job(Configurable(backoff=30)).backoff == (30.0,)
    assert RetryPolicy.for_job(Configurable(backoff=2.5)).backoff == (2.5,)
    assert RetryPolicy.for_job(Configurable(backoff=[])).backoff == (0.0,)


def test_max_exceptions_zero_means_no_such_limit():
    assert RetryPolicy.for_job(Configurable(max_exceptions=0)).max_exceptions is None


@pytest.mark.parametrize("backoff", [-1, [10, -5], "30", [float("nan")], True])
def test_a_bad_backoff_is_refused_naming_the_job(backoff):
    with pytest.raises(ValueError, match=r"Configurable\.backoff must be seconds >= 0"):
        RetryPolicy.for_job(Configurable(backoff=backoff))


def test_the_workers_tries_timeout_and_backoff_options_are_its_defaults():
    worker = Worker(WorkerOptions(tries=3, timeout=20, backoff=[10, 100], memory=0))
    policy = RetryPolicy.for_job(Configurable(), defaults=worker.pipeline.defaults)
    assert (policy.tries, policy.timeout, policy.backoff) == (3, 20.0, (10.0, 100.0))


# -- backoff ---------------------------------------------------------------------------------


def test_backoff_is_per_attempt_and_its_last_step_repeats():
    policy = RetryPolicy(backoff=(1.0, 10.0, 100.0))
    assert [policy.backoff_for(n) for n in range(1, 6)] == [1.0, 10.0, 100.0, 100.0, 100.0]
    # An attempt number below 1 (a row that never counted one) waits the first step.
    assert policy.backoff_for(0) == policy.backoff_for(-3) == 1.0


# -- may a job taken again run? ---------------------------------------------------------------


def test_a_job_may_run_until_its_tries_are_used():
    policy = RetryPolicy(tries=3)
    assert policy.out_of_attempts(1, NOON) == ""
    assert policy.out_of_attempts(3, NOON) == ""
    assert policy.out_of_attempts(4, NOON) == "3 of 3 tries used"
    assert policy.out_of_attempts(9, NOON) == "8 of 3 tries used"


def test_unlimited_tries_never_run_out():
    assert RetryPolicy(tries=0).out_of_attempts(10_000, NOON) == ""


def test_a_deadline_replaces_tries():
    policy = RetryPolicy(tries=1, retry_until=NOON)
    assert policy.out_of_attempts(50, NOON - SECOND) == ""  # tries=1 no longer counts
    assert policy.out_of_attempts(50, NOON) == ""  # not passed yet at the deadline itself
    assert policy.out_of_attempts(2, NOON + SECOND) == "retry deadline 12:00:00 UTC passed"
    next_day = NOON + datetime.timedelta(days=1)
    assert policy.out_of_attempts(2, next_day) == (
        "retry deadline 2026-12-05 12:00:00 UTC passed")


# -- does this exception end the job? ---------------------------------------------------------


def test_the_last_attempt_is_the_last_try_or_the_deadline():
    policy = RetryPolicy(tries=3)
    assert [policy.is_last_attempt(n, NOON) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert not RetryPolicy(tries=0).is_last_attempt(10_000, NOON)
    until = RetryPolicy(tries=1, retry_until=NOON)
    assert not until.is_last_attempt(5, NOON - SECOND)
    assert until.is_last_attempt(1, NOON)  # at the deadline an exception ends it


def test_an_exception_with_tries_left_is_retried():
    policy = RetryPolicy(tries=3, max_exceptions=5)
    assert policy.ends_on(timed_out=False, attempt=2, exceptions=2, now=NOON) == ""
    assert policy.ends_on(timed_out=True, attempt=2, exceptions=2, now=NOON) == ""


def test_the_last_try_names_how_it_ended():
    policy = RetryPolicy(tries=3)
    assert policy.ends_on(timed_out=False, attempt=3, exceptions=1, now=NOON) == (
        "its last try (3 of 3) raised")
    assert policy.ends_on(timed_out=True, attempt=3, exceptions=1, now=NOON) == (
        "its last try (3 of 3) timed out")


def test_max_exceptions_ends_the_job_with_tries_left():
    policy = RetryPolicy(tries=0, max_exceptions=2)
    assert policy.ends_on(timed_out=False, attempt=7, exceptions=1, now=NOON) == ""
    assert policy.ends_on(timed_out=False, attempt=8, exceptions=2, now=NOON) == (
        "2 exceptions reached its max_exceptions of 2")


def test_fail_on_timeout_ends_even_the_first_try_and_comes_first():
    policy = RetryPolicy(tries=5, max_exceptions=1, timeout=2.5, fail_on_timeout=True)
    assert policy.ends_on(timed_out=True, attempt=1, exceptions=1, now=NOON) == (
        "timed out after 2.5 s (fail_on_timeout)")
    # An exception that is not a timeout is judged by the other limits.
    assert policy.ends_on(timed_out=False, attempt=1, exceptions=1, now=NOON) == (
        "1 exceptions reached its max_exceptions of 1")


def test_after_the_deadline_an_exception_names_it():
    policy = RetryPolicy(tries=1, retry_until=NOON)
    assert policy.ends_on(timed_out=False, attempt=4, exceptions=4, now=NOON - SECOND) == ""
    assert policy.ends_on(timed_out=False, attempt=4, exceptions=4, now=NOON) == (
        "raised after its retry deadline 12:00:00 UTC")
    assert policy.ends_on(timed_out=True, attempt=4, exceptions=4, now=NOON + SECOND) == (
        "timed out after its retry deadline 12:00:00 UTC")


# -- times in messages -------------------------------------------------------------------------


def test_times_in_messages_are_utc_with_the_date_only_when_it_is_not_today():
    paris = datetime.timezone(datetime.timedelta(hours=1))
    moment = datetime.datetime(2026, 12, 5, 13, 43, 9, tzinfo=paris)  # 12:43:09 UTC
    assert when(moment, NOON) == "12:43:09 UTC"
    assert when(moment, NOON + datetime.timedelta(days=2)) == "2026-12-05 12:43:09 UTC"
    # "Today" is the UTC day: 00:30 at +01:00 is still the day before in UTC.
    late = datetime.datetime(2026, 12, 6, 0, 30, tzinfo=paris)
    assert when(late, NOON) == "23:30:00 UTC"
