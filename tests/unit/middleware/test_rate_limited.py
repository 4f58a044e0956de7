"""Limit, the limiter registry and RateLimited, in-process on both stores."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from django_jobguard import Job, Limit, RateLimited, UnknownLimiterError, rate_limiter
from django_jobguard.checks import check_settings, referenced_limiters
from django_jobguard.limits import window_key
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from django_jobguard.stores.base import RateWindow
from django_jobguard.worker import Worker, WorkerOptions
from tests.support import limit_jobs

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clear_calls():
    limit_jobs.CALLS.clear()


def work(**options) -> list[str]:
    """Run an in-process worker until nothing is due; returns the states it logged."""
    states: list[str] = []
    # memory=0: the 128 MB limit is for worker processes, not for pytest running every module.
    options = {"memory": 0, **options}
    worker = Worker(WorkerOptions(queues=["default"], stop_when_empty=True, sleep=0, **options),
                    log=lambda line, state: states.append(state))
    assert worker.run() == 0
    return [s for s in states if s != "RUNNING"]


def make_due() -> None:
    QueuedJob.objects.update(available_at=timezone.now() - datetime.timedelta(seconds=1))


def hits(key: str) -> int:
    return next((t.hits for t in get_store().throttles() if t.key == key), 0)


# -- Limit ---------------------------------------------------------------------------------


def test_limit_constructors_follow_laravel():
    assert Limit.per_second(3) == Limit(3, 1)
    assert Limit.per_second(5, decay_seconds=2) == Limit(5, 2)
    assert Limit.per_minute(10) == Limit(10, 60)
    assert Limit.per_minutes(5, 100) == Limit(100, 300)  # decay first, as in Laravel
    assert Limit.per_hour(7) == Limit(7, 3600)
    assert Limit.per_day(1000) == Limit(1000, 86400)
    assert Limit.per_minute(10).by(42) == Limit(10, 60, key="42")
    assert Limit.none().unlimited and str(Limit.none()) == "unlimited"
    assert str(Limit.per_hour(5).by("u1")) == "5/3600s by u1"


@pytest.mark.parametrize("rate, expected", [
    ("5/hour", Limit(5, 3600)), ("5/h", Limit(5, 3600)), ("100/min", Limit(100, 60)),
    ("100/m", Limit(100, 60)), ("100/minute", Limit(100, 60)), ("10/sec", Limit(10, 1)),
    ("10/s", Limit(10, 1)), ("10/second", Limit(10, 1)), ("1000/day", Limit(1000, 86400)),
    ("1000/d", Limit(1000, 86400)), (" 3 / Hour ", Limit(3, 3600)), ("20/5m", Limit(20, 300)),
    ("1/0.5s", Limit(1, 0.5)),
])
def test_parse_accepts_drf_rates(rate, expected):
    assert Limit.parse(rate) == expected


@pytest.mark.parametrize("rate", ["5", "5/fortnight", "five/hour", "5/", "/hour", "-1/hour",
                                  "5/hour/2", 5, None])
def test_parse_rejects_bad_rates_with_a_clear_message(rate):
    with pytest.raises(ValueError, match="Invalid rate"):
        Limit.parse(rate)


@pytest.mark.parametrize("args", [(0, 60), (-1, 60), (1.5, 60), (True, 60), (5, 0), (5, -1),
                                  (5, "60")])
def test_limit_validates(args):
    with pytest.raises(ValueError, match="Limit"):
        Limit(*args)


def test_window_key_includes_the_window_and_stays_short():
    assert window_key("exports", Limit.per_hour(5).by("u7")) == "jobguard:rate:exports:3600s:u7"
    assert window_key("exports", Limit.per_day(5)) == "jobguard:rate:exports:86400s"
    long = window_key("exports", Limit.per_hour(5).by("x" * 500))
    assert len(long) <= 200 and long != window_key("exports", Limit.per_hour(5).by("x" * 499))


# -- the registry ---------------------------------------------------------------------------


def test_registry_define_decorator_and_fixed_limits():
    try:
        rate_limiter.define("fixed", "3/minute")
        rate_limiter.define("fixed-limit", Limit.per_hour(2))

        @rate_limiter("decorated")
        def decorated(job):
            return [Limit.per_minute(1).by(job.key), Limit.none(), "9/hour"]

        job = limit_jobs.RateRecord("x", key="k")
        assert rate_limiter.limits_for("fixed", job) == [Limit(3, 60)]
        assert rate_limiter.limits_for("fixed-limit", job) == [Limit(2, 3600)]
        # Limit.none() inside a list is left out (Laravel would hit a PHP_INT_MAX limit).
        assert rate_limiter.limits_for("decorated", job) == [Limit(1, 60, "k"), Limit(9, 3600)]
        assert "decorated" in rate_limiter and "decorated" in rate_limiter.names()
    finally:
        for name in ("fixed", "fixed-limit", "decorated"):
            rate_limiter.remove(name)


def test_registry_rejects_bad_definitions_and_bad_return_values():
    with pytest.raises(ValueError, match="non-empty name"):
        rate_limiter.define("", lambda job: Limit.none())
    with pytest.raises(TypeError, match="function of the job"):
        rate_limiter.define("bad", 42)
    rate_limiter.define("returns-none", lambda job: None)
    try:
        with pytest.raises(TypeError, match="'returns-none' returned None"):
            rate_limiter.limits_for("returns-none", limit_jobs.RateRecord("x"))
    finally:
        rate_limiter.remove("returns-none")


def test_unknown_limiter_names_the_known_ones():
    with pytest.raises(UnknownLimiterError, match="No rate limiter is defined as 'nope'") as info:
        rate_limiter.get("nope")
    assert "'per-user'" in str(info.value) and isinstance(info.value, LookupError)


def test_rate_limited_validates_arguments():
    with pytest.raises(ValueError, match="limiter name"):
        RateLimited("")
    with pytest.raises(ValueError, match="release_after"):
        RateLimited("x", release_after=-1)


# -- RateLimited in the worker ----------------------------------------------------------------


def test_unknown_limiter_fails_the_job_at_start_with_a_clear_error(store_alias):
    limit_jobs.UndefinedLimiter("x").dispatch()
    assert work() == ["FAILED"]
    failed = FailedJob.objects.get()
    assert failed.exception_class.endswith("UnknownLimiterError")
    assert "No rate limiter is defined as 'no-such-limiter'" in failed.message
    assert limit_jobs.CALLS == []


def test_per_user_keys_do_not_interfere(store_alias, released):
    for key in ("ann", "bob", "ann", "bob", "ann", "cid"):
        limit_jobs.PerUser("export", key=key).dispatch()
    assert sorted(work()) == ["DONE"] * 5 + ["RELEASED"]
    ran = sorted(key for _, key, _ in limit_jobs.CALLS)
    assert ran == ["ann", "ann", "bob", "bob", "cid"]  # only ann's third waits
    (deferral,) = released
    assert deferral["reason"] == "rate_limited"
    assert 55 < deferral["delay"] <= 60 + 5  # until ann's first slot frees, plus jitter
    row = QueuedJob.objects.get()
    assert row.attempts == 0 and row.reserved_at is None  # the deferral gave the attempt back
    assert hits(window_key("per-user", Limit.per_minute(2).by("ann"))) == 2
    assert hits(window_key("per-user", Limit.per_minute(2).by("cid"))) == 1


def test_limit_none_is_unlimited_and_touches_no_counter(store_alias):
    for n in range(30):
        limit_jobs.Unlimited("free", key=str(n % 2)).dispatch()
    assert work() == ["DONE"] * 30
    assert get_store().throttles() == []


def test_dont_release_drops_the_job_without_failing_it(store_alias):
    for _ in range(3):
        limit_jobs.DropWhenFull("drop", key="dee").dispatch()
    assert sorted(work()) == ["DONE", "DONE", "SKIPPED"]
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert len(limit_jobs.CALLS) == 2


def test_release_after_is_used_as_given(store_alias, released):
    for _ in range(3):
        limit_jobs.ReleaseAfter("later", key="eve").dispatch()
    work()
    assert [r["delay"] for r in released] == [42.0]


def test_jitter_spreads_waiting_jobs(store_alias, released):
    for _ in range(12):
        limit_jobs.PerUser("burst", key="fay").dispatch()
    assert work().count("RELEASED") == 10
    delays = [r["delay"] for r in released]
    assert all(55 < d < 60 + 5 for d in delays)
    assert len({round(d, 3) for d in delays}) > 1  # not all at the same instant


def test_several_limits_are_all_or_nothing(store_alias):
    """PR #61449: a tenant that is over its own limit must not use up the global limit."""
    global_key = window_key("tenant", Limit.per_minute(100))
    for _ in range(5):
        limit_jobs.PerTenant("t", key="acme").dispatch()
    assert sorted(work()) == ["DONE", "DONE"] + ["RELEASED"] * 3
    assert hits(global_key) == 2  # the three refused starts were not counted globally
    limit_jobs.PerTenant("t", key="other").dispatch()
    work()
    assert hits(global_key) == 3
    assert hits(window_key("tenant", Limit.per_minute(2).by("tenant-acme"))) == 2


def test_deferrals_do_not_burn_tries(store_alias):
    """tries=2, rate-limited ten times, still runs (and as its first attempt)."""
    store = get_store()
    window = window_key("gate", Limit.per_minute(1).by("gil"))
    limit_jobs.TwoTries("patient", key="gil").dispatch()
    for _ in range(10):
        store.reset_throttle(window)
        assert store.hit_rate_limits([RateWindow(window, 1, 60)]).allowed  # someone else ran
        assert work() == ["RELEASED"]
        make_due()
    store.reset_throttle(window)
    assert work() == ["DONE"]
    assert limit_jobs.CALLS == [("patient", "gil", 1)]
    assert not FailedJob.objects.exists()


def test_deferrals_consume_tries_when_the_setting_says_so(store_alias, settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "DEFERRALS_CONSUME_ATTEMPTS": True}
    store = get_store()
    window = window_key("gate", Limit.per_minute(1).by("hal"))
    limit_jobs.TwoTries("counted", key="hal").dispatch()
    states = []
    for _ in range(3):
        store.reset_throttle(window)
        store.hit_rate_limits([RateWindow(window, 1, 60)])
        states += work()
        make_due()
    assert states == ["RELEASED", "RELEASED", "FAILED"]  # Laravel's counting
    assert FailedJob.objects.get().exception_class.endswith("MaxAttemptsExceededError")


def test_a_failed_run_still_used_its_slot(store_alias, released):
    """The start is counted before the job runs (Laravel; PR #59618 was not merged)."""
    limit_jobs.FailsAfterAdmission("fails", key="ida").dispatch()
    assert work() == ["RELEASED", "RELEASED"]
    # The exception retried it at once (an attempt used); the retry was refused: the failed
    # run holds the only slot.
    assert [r["reason"] for r in released] == ["exception", "rate_limited"]
    assert QueuedJob.objects.get().attempts == 1
    assert len(limit_jobs.CALLS) == 1
    assert hits(window_key("gate", Limit.per_minute(1).by("ida"))) == 1


def test_admission_time_is_the_store_time(store_alias):
    before = get_store().now()
    limit_jobs.PerUser("when", key="jo").dispatch()
    work()
    from demo.models import JobRun

    run = JobRun.objects.get()
    after = get_store().now()
    admitted = datetime.datetime.fromtimestamp(run.token / 1_000_000, tz=datetime.UTC)
    assert before <= admitted <= after


def test_dispatch_sync_applies_the_limit_and_a_refusal_skips_the_run(store_alias):
    for _ in range(3):
        limit_jobs.PerUser("sync", key="kim").dispatch_sync()
    assert len(limit_jobs.CALLS) == 2


# -- the system check -------------------------------------------------------------------------


def test_check_finds_literal_limiter_names_in_middleware(scratch_jobs):
    class UsesMissing(Job):
        name = "tests.UsesMissing"

        def middleware(self):
            return [RateLimited("missing-limiter"), RateLimited("per-user", dont_release=True)]

    assert referenced_limiters(UsesMissing) == {"missing-limiter", "per-user"}
    errors = [e for e in check_settings() if e.id == "jobguard.E007"]
    assert len(errors) == 1
    assert "'tests.UsesMissing' uses RateLimited('missing-limiter')" in errors[0].msg


def test_check_passes_when_every_limiter_is_defined(scratch_jobs):
    class UsesDefined(Job):
        name = "tests.UsesDefined"

        def middleware(self):
            return [RateLimited("per-user")]

    assert [e for e in check_settings() if e.id == "jobguard.E007"] == []


def test_real_windows_and_circuits_reach_the_operator_views(store_alias):
    """What the admin and the API list (operations.inspect_throttles) from real counters."""
    from django_jobguard import operations

    store = get_store()
    window = window_key("per-user", Limit.per_minute(2).by("ops"))
    store.hit_rate_limits([RateWindow(window, 2, 60)])
    store.circuit_leave("jobguard:circuit:ops", owner="x", outcome="failure", max_attempts=1,
                        decay=30)
    rows = {row.key: row for row in operations.inspect_throttles(store)}
    assert set(rows) == {window, "jobguard:circuit:ops"}
    assert (rows[window].info.kind, rows[window].info.hits, rows[window].info.limit) == (
        "rate", 1, 2)
    assert 55 < rows[window].resets_in <= 60
    circuit = rows["jobguard:circuit:ops"].info
    assert (circuit.kind, circuit.state, circuit.hits) == ("circuit", "open", 1)
    assert 25 < rows["jobguard:circuit:ops"].resets_in <= 30
    assert operations.reset_throttle(store, window) and not store.reset_throttle(window)
    assert [t.key for t in store.throttles()] == ["jobguard:circuit:ops"]
