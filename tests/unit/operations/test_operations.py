"""The operations layer, action by action, on the database under test: what each one changes,
and the one audit line each destructive action writes. Job states are checked here too."""

from __future__ import annotations

import datetime
import logging
import uuid
from unittest import mock

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobguard import operations, queue, results
from django_jobguard.models import STATES, FailedJob, JobResult, QueuedJob, Worker
from django_jobguard.stores import get_store
from django_jobguard.unique_jobs import lock_key
from tests.support import expire, jobs, requires_postgres, requires_redis
from tests.support.lock_jobs import UniqueRecord
from tests.support.operate import delayed, reserved, waiting

pytestmark = pytest.mark.django_db

REAL_NOW = timezone.now


@pytest.fixture
def audit(caplog):
    """The audit records written during the test."""
    caplog.set_level(logging.WARNING, logger="django_jobguard.operations")

    def records() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "django_jobguard.operations"]

    return records


def assert_one_audit(records: list[logging.LogRecord], *, operation: str, count: int,
                     actor: str, text: str) -> None:
    assert len(records) == 1, [r.getMessage() for r in records]
    [record] = records
    assert record.levelno == logging.WARNING
    assert (record.operation, record.count, record.actor) == (operation, count, actor)
    assert text in record.getMessage() and record.getMessage().endswith(f" by {actor}.")


def failed(name: str = "tests.support.jobs.Noop", queue_name: str = "default", *,
           hours_ago: float = 0,
           payload: dict | None = None, priority: int = 0) -> FailedJob:
    row = FailedJob.objects.create(name=name, queue=queue_name, priority=priority,
                                   payload=payload or {"args": [1], "kwargs": {}},
                                   exception_class="builtins.RuntimeError", message="boom",
                                   attempts=3)
    if hours_ago:
        FailedJob.objects.filter(id=row.id).update(
            failed_at=timezone.now() - datetime.timedelta(hours=hours_ago))
    return row


# -- states ----------------------------------------------------------------------------------


def test_each_state_has_its_queryset_and_annotation():
    w, d, r = waiting(), delayed(), reserved()
    assert STATES == ("waiting", "delayed", "reserved") and operations.STATES is STATES
    assert list(QueuedJob.objects.waiting()) == [w]
    assert list(QueuedJob.objects.delayed()) == [d]
    assert list(QueuedJob.objects.reserved()) == [r]
    assert set(QueuedJob.objects.unreserved()) == {w, d}
    for state, row in zip(STATES, (w, d, r), strict=True):
        assert list(QueuedJob.objects.in_state(state)) == [row]
    annotated = dict(QueuedJob.objects.with_state().values_list("id", "jobguard_state"))
    assert annotated == {w.id: "waiting", d.id: "delayed", r.id: "reserved"}
    assert QueuedJob.objects.state_counts() == {
        "default": {"waiting": 1, "delayed": 1, "reserved": 0},
        "busy": {"waiting": 0, "delayed": 0, "reserved": 1}}


def test_an_unknown_state_names_the_valid_ones():
    with pytest.raises(ValueError, match="'running'; expected one of waiting, delayed, reserved"):
        QueuedJob.objects.in_state("running")


def test_a_reserved_job_whose_lease_ran_out_is_waiting_again():
    r = reserved()
    QueuedJob.objects.filter(id=r.id).update(
        available_at=timezone.now() - datetime.timedelta(seconds=1))
    assert list(QueuedJob.objects.waiting()) == [r]
    assert not QueuedJob.objects.reserved().exists()


def test_states_follow_the_database_clock_not_this_process():
    d = delayed()  # due in an hour
    r = reserved()
    skewed = mock.patch("django.utils.timezone.now",
                        return_value=REAL_NOW() + datetime.timedelta(days=2))
    with skewed:
        assert QueuedJob.objects.get(id=d.id).state == "delayed"
        assert QueuedJob.objects.get(id=r.id).state == "reserved"
        assert list(QueuedJob.objects.delayed()) == [d]


def test_state_reads_the_annotation_without_a_query_and_queries_without_it(
        django_assert_num_queries):
    row = delayed()
    annotated = QueuedJob.objects.with_state().get(id=row.id)
    with django_assert_num_queries(0):
        assert annotated.state == "delayed"
    plain = QueuedJob.objects.get(id=row.id)
    with django_assert_num_queries(1):
        assert plain.state == "delayed"
    plain.delete()
    with pytest.raises(QueuedJob.DoesNotExist):
        plain.state  # noqa: B018


# -- queued jobs -----------------------------------------------------------------------------


def test_cancel_deletes_unreserved_jobs_frees_their_locks_and_keeps_reserved_ones(audit):
    store = get_store()
    unique_job = UniqueRecord("cancel")
    dispatched = unique_job.dispatch()
    busy = reserved()
    result = operations.cancel(list(QueuedJob.objects.all()), actor="ann")
    assert result.cancelled == [str(dispatched.id)] and result.reserved == [str(busy.id)]
    assert list(QueuedJob.objects.all()) == [busy]
    assert store.get_lock(lock_key(unique_job)) is None
    assert_one_audit(audit(), operation="cancel", count=1, actor="ann",
                     text="Cancelled 1 queued job(s)")


def test_cancel_of_only_reserved_jobs_writes_no_audit_line(audit):
    busy = reserved()
    assert operations.cancel([busy], actor="ann").reserved == [str(busy.id)]
    assert audit() == []


def test_run_now_makes_delayed_jobs_due_and_leaves_reserved_ones():
    d, r = delayed(), reserved()
    lease = r.available_at
    assert operations.run_now(QueuedJob.objects.all()) == 1
    assert list(QueuedJob.objects.waiting()) == [d]
    r.refresh_from_db()
    assert r.available_at == lease


def test_clear_deletes_waiting_and_delayed_jobs_of_the_queues_and_frees_their_locks(audit):
    store = get_store()
    busy = reserved(queue_name="a")  # claimed first: reserved() takes the queue's first job
    assert UniqueRecord("a").dispatch(queue="a")
    delayed(queue_name="a")
    b = jobs.Noop().dispatch(queue="b")
    result = operations.clear(["a"], actor="manage.py jobs_clear")
    assert (result.cleared, result.locks_released) == (2, 1)
    assert {str(i) for i in QueuedJob.objects.values_list("id", flat=True)} == {b.id, str(busy.id)}
    assert store.get_lock(lock_key(UniqueRecord("a"))) is None
    assert_one_audit(audit(), operation="clear", count=2, actor="manage.py jobs_clear",
                     text="Cleared 2 queued job(s) from queue(s) a (1 unique lock(s) released)")


def test_clear_can_keep_unique_locks(audit):
    UniqueRecord("kept").dispatch()
    result = operations.clear(keep_locks=True, actor="ann")
    assert (result.cleared, result.locks_released) == (1, 0)
    assert not QueuedJob.objects.exists()
    assert get_store().get_lock(lock_key(UniqueRecord("kept"))) is not None
    assert_one_audit(audit(), operation="clear", count=1, actor="ann",
                     text="from all queues (unique locks kept)")


# -- retry -----------------------------------------------------------------------------------


def test_retry_requeues_under_the_same_id_with_fresh_attempts_and_priority(audit):
    row = failed(priority=5)
    assert operations.retry([str(row.id)], actor="ann") == [str(row.id)]
    job = QueuedJob.objects.get(id=row.id)
    assert (job.attempts, job.priority, job.name, job.payload) == (0, 5, row.name, row.payload)
    assert job.state == "waiting"
    assert not FailedJob.objects.exists()
    assert_one_audit(audit(), operation="retry", count=1, actor="ann",
                     text="Retried 1 failed job(s)")


def test_retry_selects_by_rows_queryset_or_all_optionally_by_queue():
    a1, a2, b = failed(queue_name="a", hours_ago=2), failed(queue_name="a", hours_ago=1), \
        failed(queue_name="b")
    assert operations.retry([b]) == [str(b.id)]
    assert operations.retry(FailedJob.objects.filter(id=a2.id)) == [str(a2.id)]
    c = failed(queue_name="c")
    assert operations.retry(queue="a") == [str(a1.id)]
    assert operations.retry() == [str(c.id)]
    assert set(QueuedJob.objects.values_list("id", flat=True)) == {a1.id, a2.id, b.id, c.id}


def test_retry_of_all_is_oldest_failure_first():
    new, old = failed(hours_ago=1), failed(hours_ago=5)
    assert operations.retry() == [str(old.id), str(new.id)]


def test_retry_of_named_ids_must_find_them_all(audit):
    row = failed()
    unknown = str(uuid.uuid4())
    with pytest.raises(operations.FailedJobNotFound, match=f"No failed job matches {unknown}"):
        operations.retry([str(row.id), unknown])
    with pytest.raises(ValueError, match="UUIDs; 'nope' is not one"):
        operations.retry(["nope"])
    assert FailedJob.objects.filter(id=row.id).exists() and not QueuedJob.objects.exists()
    assert audit() == []


def test_retry_recomputes_retry_until_and_drops_one_it_cannot_compute():
    class Deadline(jobs.Noop):
        name = "tests.operations.Deadline"

        def retry_until(self):
            return timezone.now() + datetime.timedelta(minutes=10)

    kept = failed(name=Deadline.name, payload={"args": [], "kwargs": {},
                                               "retry_until": "2000-01-01T00:00:00+00:00"})
    gone = failed(name="tests.operations.Unregistered",
                  payload={"args": [], "kwargs": {}, "retry_until": "2000-01-01T00:00:00+00:00"})
    operations.retry([kept, gone])
    deadline = datetime.datetime.fromisoformat(
        QueuedJob.objects.get(id=kept.id).payload["retry_until"])
    assert deadline > timezone.now() + datetime.timedelta(minutes=9)
    assert "retry_until" not in QueuedJob.objects.get(id=gone.id).payload


def test_retry_puts_a_kept_result_back_to_ready():
    row = failed()
    JobResult.objects.create(id=row.id, name=row.name, queue=row.queue, status=results.FAILED,
                             finished_at=timezone.now())
    operations.retry([row])
    result = JobResult.objects.get(id=row.id)
    assert (result.status, result.finished_at) == (results.READY, None)


def test_retry_in_batches_does_a_fixed_number_of_queries_per_batch():
    def queries_to_retry(count: int) -> int:
        for _ in range(count):
            failed()
        with CaptureQueriesContext(connection) as captured:
            assert len(operations.retry()) == count
        return len(captured)

    assert queries_to_retry(3) == queries_to_retry(40)
    for _ in range(5):
        failed()
    assert len(operations.retry(batch_size=2)) == 5
    assert QueuedJob.objects.count() == 48 and not FailedJob.objects.exists()


def test_retry_is_all_or_nothing_when_a_queued_job_has_the_id_already(audit):
    first, clash = failed(), failed()
    QueuedJob.objects.create(id=clash.id, name=clash.name, queue="default")
    with pytest.raises(IntegrityError):
        operations.retry([first, clash])
    assert FailedJob.objects.count() == 2
    assert list(QueuedJob.objects.values_list("id", flat=True)) == [clash.id]
    assert audit() == []


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_retry_wakes_postgresql_workers_when_it_commits():
    listener = queue.listen()
    try:
        failed(queue_name="wake")
        operations.retry()
        assert listener.wait(timeout=5)
    finally:
        listener.close()


# -- forget, flush, prune --------------------------------------------------------------------


def test_forget_rows_ids_or_a_queryset(audit):
    a, b, c = failed(), failed(), failed(queue_name="other")
    assert operations.forget([a], actor="ann") == 1
    assert operations.forget([str(b.id)], actor="ann") == 1
    assert operations.forget(FailedJob.objects.filter(queue="other"), actor="ann") == 1
    assert not FailedJob.objects.exists() and c
    assert [r.count for r in audit()] == [1, 1, 1]
    assert {r.operation for r in audit()} == {"forget"}
    assert audit()[0].getMessage() == "Forgot 1 failed job(s) by ann."


def test_forget_refuses_unknown_ids_and_a_missing_selection():
    row = failed()
    with pytest.raises(operations.FailedJobNotFound):
        operations.forget([str(uuid.uuid4())])
    with pytest.raises(ValueError, match="flush"):
        operations.forget(None)
    assert FailedJob.objects.filter(id=row.id).exists()


def test_flush_all_or_older_than(audit):
    failed(hours_ago=48)
    failed(hours_ago=1)
    assert operations.flush(datetime.timedelta(hours=24), actor="ann") == 1
    assert FailedJob.objects.count() == 1
    assert operations.flush(actor="ann") == 1
    assert not FailedJob.objects.exists()
    assert [(r.operation, r.count) for r in audit()] == [("flush", 1), ("flush", 1)]
    assert "older than 1 day, 0:00:00" in audit()[0].getMessage()
    with pytest.raises(ValueError, match="must not be negative"):
        operations.flush(datetime.timedelta(hours=-1))


def test_prune_failed(audit):
    old, recent = failed(hours_ago=30), failed(hours_ago=2)
    assert operations.prune_failed(datetime.timedelta(hours=24), actor="cron") == 1
    assert list(FailedJob.objects.all()) == [recent] and old
    assert operations.prune_failed(datetime.timedelta(hours=24), actor="cron") == 0
    assert_one_audit(audit(), operation="prune_failed", count=1, actor="cron",
                     text="Pruned 1 failed job(s) older than 1 day")


def test_prune_results(audit):
    old = JobResult.objects.create(id=uuid.uuid4(), name="t", queue="default",
                                   status=results.SUCCESSFUL,
                                   finished_at=timezone.now() - datetime.timedelta(days=3))
    fresh = JobResult.objects.create(id=uuid.uuid4(), name="t", queue="default",
                                     status=results.SUCCESSFUL, finished_at=timezone.now())
    assert operations.prune_results(datetime.timedelta(days=1), actor="ann") == 1
    assert list(JobResult.objects.all()) == [fresh] and old
    assert_one_audit(audit(), operation="prune_results", count=1, actor="ann",
                     text="Pruned 1 job result(s)")
    with pytest.raises(ValueError, match="must not be negative"):
        operations.prune_results(datetime.timedelta(days=-1))


def test_result_retention_follows_the_setting(settings):
    assert operations.result_retention() == datetime.timedelta(days=7)
    settings.JOBGUARD = {**settings.JOBGUARD, "RESULT_RETENTION_DAYS": 0}
    assert operations.result_retention() is None


# -- locks and throttles ---------------------------------------------------------------------


def test_force_release_and_its_audit_line(store_alias, audit):
    store = get_store(store_alias)
    assert store.acquire("jobguard:overlap:ops", "someone", ttl=60)
    assert operations.force_release(store, "jobguard:overlap:ops", actor="ann")
    assert store.get_lock("jobguard:overlap:ops") is None
    assert not operations.force_release(store, "jobguard:overlap:ops", actor="ann")
    assert_one_audit(audit(), operation="force_release", count=1, actor="ann",
                     text=f"Lock jobguard:overlap:ops in store {store_alias} force-released")


def test_reset_throttle_and_its_audit_line(store_alias, audit):
    store = get_store(store_alias)
    store.circuit_leave("jobguard:circuit:ops", owner="x", outcome="failure", max_attempts=1,
                        decay=30)
    assert operations.reset_throttle(store, "jobguard:circuit:ops", actor="ann")
    assert store.throttles() == []
    assert not operations.reset_throttle(store, "jobguard:circuit:ops", actor="ann")
    assert_one_audit(audit(), operation="reset_throttle", count=1, actor="ann",
                     text=f"Throttle jobguard:circuit:ops in store {store_alias} reset")


def test_clean_locks_removes_expired_ones(audit):
    store = get_store("database")
    store.acquire("jobguard:overlap:old", "o", ttl=60)
    store.acquire("jobguard:overlap:live", "o", ttl=60)
    expire(store, "jobguard:overlap:old")
    assert operations.clean_locks(store, actor="manage.py jobs_locks") == 1
    assert [i.key for i in store.locks(include_expired=True)] == ["jobguard:overlap:live"]
    assert_one_audit(audit(), operation="clean_locks", count=1, actor="manage.py jobs_locks",
                     text="Removed 1 expired lock(s) from store database")


# -- stats, monitor, housekeeping ------------------------------------------------------------


def test_stats_counts_queues_failed_jobs_and_live_workers():
    waiting(), delayed(), reserved(worker_id="host:1:live")
    failed(queue_name="default")
    failed(queue_name="only-failed")
    Worker.objects.filter(id="host:1:live").update(done_last_minute=4, failed_last_minute=1)
    Worker.objects.create(id="host:2:old", hostname="h", pid=2, queues="default",
                          done_last_minute=9)
    Worker.objects.filter(id="host:2:old").update(
        last_seen_at=timezone.now() - datetime.timedelta(hours=1))
    assert operations.stats() == {
        "queues": {"default": {"waiting": 1, "delayed": 1, "reserved": 0, "failed": 1},
                   "busy": {"waiting": 0, "delayed": 0, "reserved": 1, "failed": 0},
                   "only-failed": {"waiting": 0, "delayed": 0, "reserved": 0, "failed": 1}},
        "workers": 1, "done_last_minute": 4, "failed_last_minute": 1}


def test_monitor_reports_each_queue_against_its_threshold():
    for _ in range(3):
        waiting()
    waiting(queue_name="high")
    report = operations.monitor({"default": 3, "high": 5, "idle": 1})
    assert [(q.queue, q.size, q.max, q.status) for q in report.queues] == [
        ("default", 3, 3, "ALERT"), ("high", 1, 5, "OK"), ("idle", 0, 1, "OK")]
    assert report.alerts == ["default"]
    every = operations.monitor(default_max=2)
    assert [(q.queue, q.status) for q in every.queues] == [("default", "ALERT"),
                                                          ("high", "OK")]
    assert every.queues[0].as_dict() == {"queue": "default", "size": 3, "waiting": 3,
                                         "delayed": 0, "reserved": 0, "failed": 0, "max": 2,
                                         "status": "ALERT", "unserved": True,
                                         "paused": False}


def test_housekeeping_drops_expired_locks_old_results_and_dead_workers(audit):
    store = get_store()
    store.acquire("jobguard:overlap:old", "o", ttl=60)
    expire(store, "jobguard:overlap:old")
    JobResult.objects.create(id=uuid.uuid4(), name="t", queue="default",
                             status=results.SUCCESSFUL,
                             finished_at=timezone.now() - datetime.timedelta(days=30))
    Worker.objects.create(id="live", hostname="h", pid=1, queues="default")
    Worker.objects.create(id="dead", hostname="h", pid=2, queues="default")
    Worker.objects.filter(id="dead").update(
        last_seen_at=timezone.now() - datetime.timedelta(days=1))
    done = operations.housekeeping()
    assert (done.results, done.dead_workers) == (1, 1)
    assert list(Worker.objects.values_list("id", flat=True)) == ["live"]
    assert not JobResult.objects.exists()
    # (only this test's lock: the Redis database may hold another test's keys)
    assert "jobguard:overlap:old" not in {i.key for i in store.locks(include_expired=True)}
    assert audit() == []  # routine, not an operator's action


@pytest.mark.django_db(transaction=True)  # as a worker runs it: not in a transaction
@pytest.mark.parametrize("kind", ["database", "redis"])
def test_housekeeping_goes_on_without_a_store_that_cannot_be_reached(kind, caplog):
    """A database store's expired locks and throttles wait for the next round, with one
    WARNING line; the queue's own chores are done. A Redis store, which drops expired keys
    itself, is not called at all: housekeeping runs in the thread that renews the leases, and
    a Redis that hangs must not hold the renewals back (a review's finding)."""
    from django.test import override_settings

    from django_jobguard.conf import jobguard_settings
    from tests.support.store_faults import store_down

    Worker.objects.create(id="dead", hostname="h", pid=2, queues="default")
    Worker.objects.filter(id="dead").update(
        last_seen_at=timezone.now() - datetime.timedelta(days=1))
    with store_down(kind) as alias, override_settings(
            JOBGUARD={**jobguard_settings.user_settings, "STORE": alias}), \
            caplog.at_level(logging.INFO):
        done = operations.housekeeping()
    assert (done.expired_locks, done.expired_throttles, done.dead_workers) == (0, 0, 1)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if kind == "redis":
        assert lines == []  # never asked
    else:
        assert len(lines) == 1 and lines[0].startswith(
            f"Housekeeping skipped the expired locks and throttles of store {alias}: it is "
            "unavailable (")


@requires_redis
@pytest.mark.parametrize("store_alias", ["redis"], indirect=True)
def test_housekeeping_makes_no_call_to_a_redis_store(store_alias, monkeypatch):
    """Redis drops expired locks and windows itself: the heartbeat thread's housekeeping
    leaves it alone (a hung Redis would hold back the lease renewals behind it)."""
    from django_jobguard.stores import get_store

    store = get_store(store_alias)
    calls = []
    monkeypatch.setattr(type(store), "clean_expired", lambda self: calls.append(1) or 0)
    operations.housekeeping()
    assert store.cleans_itself and calls == []


def test_housekeeping_prunes_failed_jobs_only_when_a_retention_is_set(settings, audit):
    old, recent = failed(hours_ago=24 * 8), failed(hours_ago=24 * 6)
    assert operations.housekeeping().failed == 0  # default: failed jobs are kept
    assert FailedJob.objects.count() == 2
    settings.JOBGUARD = {**settings.JOBGUARD, "FAILED_RETENTION_DAYS": 7}
    with CaptureQueriesContext(connection) as captured:
        assert operations.housekeeping().failed == 1
    assert list(FailedJob.objects.values_list("id", flat=True)) == [recent.id]
    deletes = [q["sql"] for q in captured if q["sql"].upper().startswith("DELETE")
               and "failedjob" in q["sql"].split(" WHERE ")[0].lower()]
    assert len(deletes) == 1  # one bulk statement, however many
    assert not FailedJob.objects.filter(id=old.id).exists()
    assert audit() == []
