"""The finished-job history (issue 31 A and B): FinishedRun rows written by the workers when
``JOBGUARD["HISTORY"]`` asks, buffered and bulk-inserted, pruned in batches; per-class
statistics; the admin pages and ``GET runs/``."""

from __future__ import annotations

import datetime
import uuid

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from django_jobguard import history, observe, operations, signals
from django_jobguard.checks import check_settings
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, FinishedRun, QueuedJob, RunStatistic
from django_jobguard.worker import Worker, WorkerOptions
from tests.support import jobs
from tests.support.inprocess import work
from tests.support.operate import API, assert_error, user_with

pytestmark = pytest.mark.django_db


def history_settings(mode: str, **more):
    return override_settings(JOBGUARD={**jobguard_settings.user_settings, "HISTORY": mode,
                                       **more})


class FakeRow:
    """What job_line passes: a claimed row's fields."""

    def __init__(self, name: str = "demo.Job", queue: str = "default", args=(1,), attempts=1):
        now = timezone.now()
        self.id, self.name, self.queue, self.attempts = uuid.uuid4(), name, queue, attempts
        self.payload = {"args": list(args), "kwargs": {"k": "v"}, "unique": None}
        self.available_at, self.reserved_at = now - datetime.timedelta(seconds=2), now


def run(name="a.Job", queue="default", state="DONE", runtime=1.0, wait=0.5, ago=60.0,
        **fields) -> FinishedRun:
    finished = timezone.now() - datetime.timedelta(seconds=ago)
    return FinishedRun.objects.create(
        job_id=uuid.uuid4(), name=name, queue=queue, state=state, runtime=runtime, wait=wait,
        started_at=finished - datetime.timedelta(seconds=runtime or 0), finished_at=finished,
        **fields)


# -- what the workers write ----------------------------------------------------------------


def test_history_off_installs_nothing_and_writes_nothing():
    assert jobguard_settings.HISTORY == "off"  # the default
    jobs.Noop(1).dispatch()
    worker = Worker(WorkerOptions(stop_when_empty=True, memory=0, sleep=0))
    assert worker._run_history is None
    assert worker.run() == 0
    assert observe._run_recorders == []
    assert not FinishedRun.objects.exists()


def test_history_all_records_each_finished_run_with_its_details():
    with history_settings("all"):
        done = jobs.Noop(7).dispatch()
        failed = jobs.FailMe().dispatch()
        assert sorted(work()) == ["DONE", "FAILED"]
    assert observe._run_recorders == []  # removed at shutdown
    ok = FinishedRun.objects.get(job_id=done.id)
    assert (ok.state, ok.name, ok.queue, ok.arguments, ok.attempt, ok.error) == (
        "DONE", "tests.support.jobs.Noop", "default", {"args": [7], "kwargs": {}}, 1, "")
    assert ok.runtime is not None and ok.runtime >= 0 and ok.wait is not None and ok.wait >= 0
    assert ok.started_at <= ok.finished_at and ok.worker
    assert ok.result_size == 1  # Noop(7) returned 7: one byte of JSON
    bad = FinishedRun.objects.get(job_id=failed.id)
    assert bad.state == "FAILED" and "no point retrying" in bad.error
    assert bad.result_size is None
    assert FinishedRun.objects.count() == 2


def test_history_failures_records_only_the_runs_that_failed_for_good():
    with history_settings("failures"):
        jobs.Noop(1).dispatch()
        failed = jobs.FailMe().dispatch()
        work()
    assert [(str(job_id), state) for job_id, state in
            FinishedRun.objects.values_list("job_id", "state")] == [(str(failed.id), "FAILED")]


def test_a_released_run_is_not_a_finished_one():
    with history_settings("all"):
        jobs.ReleaseMe().dispatch()  # released at once, then out of tries
        states = work()
    assert states.count("RELEASED") >= 1 and states[-1] == "FAILED"
    assert not QueuedJob.objects.exists()
    (only,) = FinishedRun.objects.all()
    failed = FailedJob.objects.get()
    assert (only.state, only.attempt, only.job_id) == ("FAILED", failed.attempts, failed.id)


def test_runs_are_buffered_then_inserted_in_one_statement():
    recorder = history.RunRecorder("w1")
    for _ in range(20):
        recorder("w1", FakeRow(), "DONE", 0.25, "")
    recorder("w2", FakeRow(), "DONE", 0.25, "")  # another worker's line in this process
    recorder("w1", FakeRow(), "RELEASED", 0.25, "")  # not finished
    assert recorder.pending() == 20 and not FinishedRun.objects.exists()
    with CaptureQueriesContext(connection) as queries:
        assert recorder.flush() == 20
    inserts = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"].upper()]
    if connection.vendor == "postgresql":  # one unnest(), the statistics added by the server
        assert len(inserts) == 1 and inserts[0].startswith("WITH ins AS (INSERT")
        assert "jobguard_runstatistic" in inserts[0]
    else:  # one executemany, one upsert of the statistics
        assert len(inserts) == 2 and inserts[0].startswith("20 times: INSERT")
        assert "jobguard_runstatistic" in inserts[1]
    assert FinishedRun.objects.count() == 20 and recorder.pending() == 0
    one = FinishedRun.objects.first()
    assert one.wait == pytest.approx(2.0) and one.runtime == 0.25
    assert one.arguments == {"args": [1], "kwargs": {"k": "v"}}


def test_a_failed_flush_keeps_the_runs_and_a_retried_one_records_none_twice(monkeypatch):
    recorder = history.RunRecorder("w1")
    for _ in range(3):
        recorder("w1", FakeRow(), "DONE", 0.1, "")
    original = history.insert_notes

    def written_then_lost(worker_id, notes, **kwargs):  # the INSERT commits, the answer is lost
        original(worker_id, notes, **kwargs)
        raise ConnectionError("connection reset after commit")

    monkeypatch.setattr(history, "insert_notes", written_then_lost)
    with pytest.raises(ConnectionError):
        recorder.flush()
    monkeypatch.undo()
    assert recorder.pending() == 3
    assert recorder.flush() == 3  # inserted again: every row is skipped, none twice
    assert FinishedRun.objects.count() == 3


def test_insert_runs_writes_in_one_statement_and_skips_runs_already_there():
    runs = [history.run_of("w1", history.note_of(FakeRow(args=[n]), "DONE", 0.5))
            for n in range(1200)]
    with CaptureQueriesContext(connection) as queries:
        history.insert_runs(runs)
    inserts = [q for q in queries.captured_queries if "INSERT" in q["sql"].upper()
               and "jobguard_runstatistic" not in q["sql"].split("(")[0]]
    assert len(inserts) == 1 and FinishedRun.objects.count() == 1200
    history.insert_runs(runs[:10] + [
        history.run_of("w1", history.note_of(FakeRow(), "FAILED", 1.0, "E: x"))])
    assert FinishedRun.objects.count() == 1201
    for span in history.SPANS:  # the runs already there are not counted again
        summary = RunStatistic.objects.filter(span=span, bucket=history.SUMMARY)
        assert summary.aggregate(n=Sum("runs"), f=Sum("failures")) == {"n": 1201, "f": 1}
    stored = FinishedRun.objects.get(state="FAILED")
    assert (stored.error, stored.runtime, stored.arguments) == (
        "E: x", 1.0, {"args": [1], "kwargs": {"k": "v"}})
    assert stored.finished_at - stored.started_at == datetime.timedelta(seconds=1)
    assert stored.wait == pytest.approx(2.0)
    assert sorted(r.arguments["args"][0] for r in FinishedRun.objects.filter(state="DONE")) \
        == list(range(1200))


def test_the_server_describes_the_notes_as_run_of_does():
    """PostgreSQL describes the buffered notes in SQL (insert_notes); elsewhere run_of does:
    the rows are the same."""
    odd = FakeRow(args=[1, {"x": "é"}])
    odd.payload = "not a payload"
    notes = [history.note_of(FakeRow(), "DONE", 0.25, result_size=12),
             history.note_of(FakeRow(), "FAILED", None, "ValueError: x"),
             history.note_of(odd, "DONE", 1.5)]
    notes[1] = (*notes[1][:6], None, None, *notes[1][8:])  # no due/reserved time: no wait
    history.insert_notes("w" * 120, notes)
    fields = [name for name in history.COLUMNS if name != "job_id"]
    stored = {str(row["job_id"]): row for row in FinishedRun.objects.values("job_id", *fields)}
    for note in notes:
        expected = dict(zip(history.COLUMNS, history.run_of("w" * 120, note), strict=True))
        got = stored[str(note[0])]
        for name in fields:
            if isinstance(expected[name], float):
                assert got[name] == pytest.approx(expected[name], abs=1e-6), name
            elif isinstance(expected[name], datetime.datetime):
                assert abs(got[name] - expected[name]) <= datetime.timedelta(microseconds=1)
            else:
                assert got[name] == expected[name], (name, got[name], expected[name])
    assert RunStatistic.objects.filter(bucket=history.SUMMARY).aggregate(n=Sum("runs")) \
        == {"n": 2 * len(notes)}  # one minute row and one hour row each


def test_a_note_that_cannot_be_written_is_dropped_and_the_others_recorded(caplog):
    bad = FakeRow()
    bad.payload = {"args": [object()], "kwargs": {}}  # not JSON
    notes = [history.note_of(FakeRow(), "DONE", 0.1), history.note_of(bad, "DONE", 0.1)]
    history.insert_notes("w1", notes)
    assert [str(i) for i in FinishedRun.objects.values_list("job_id", flat=True)] \
        == [str(notes[0][0])]
    assert f"Could not record the run of {bad.id}" in caplog.text


def test_result_sizes_come_from_job_processed_and_are_not_kept_past_the_line():
    mine, other = history.RunRecorder("w1"), history.RunRecorder("w2")
    mine.start(), other.start()
    try:
        row, not_json = FakeRow(), FakeRow()
        signals.job_processed.send(sender=None, job=None, job_id=str(row.id),
                                   result={"total": 12})
        signals.job_processed.send(sender=None, job=None, job_id=str(not_json.id),
                                   result=object())
        observe.job_line("w1", row, "DONE", 0.1)
        observe.job_line("w1", not_json, "DONE", 0.1)
    finally:
        mine.stop(), other.stop()
    assert mine._sizes == {} and other._sizes == {}  # w2 dropped the notes of w1's jobs
    assert other.pending() == 0 and mine.flush() == 2
    sizes = dict(FinishedRun.objects.values_list("job_id", "result_size"))
    assert sizes[row.id] == len('{"total":12}')
    assert sizes[not_json.id] > len("<object object at 0x")
    assert observe._run_recorders == []


def test_a_run_that_cannot_be_described_does_not_break_the_job(caplog):
    recorder = history.RunRecorder("w1")
    row = FakeRow()
    del row.payload  # a broken row
    recorder("w1", row, "DONE", 0.1, "")
    assert recorder.pending() == 0 and "Could not record the run" in caplog.text


# -- pruning ------------------------------------------------------------------------------


def test_prune_deletes_old_runs_in_bounded_batches():
    for _ in range(5):
        run(ago=9 * 86400)
    keep = [run(ago=60), run(ago=6 * 86400)]
    assert history.prune_runs(batch=3) == 3
    assert history.prune_runs(batch=3) == 2
    assert history.prune_runs(batch=3) == 0
    assert set(FinishedRun.objects.values_list("id", flat=True)) == {r.id for r in keep}


def test_housekeeping_prunes_runs_past_the_retention():
    run(ago=3 * 86400), run(ago=60)
    with history_settings("all", HISTORY_RETENTION_DAYS=2):
        assert operations.housekeeping().runs == 1
    assert FinishedRun.objects.count() == 1


# -- statistics ---------------------------------------------------------------------------


def test_statistics_per_class_and_queue_with_percentiles_and_windows():
    for seconds in range(1, 11):  # runtimes 1..10, waits 0.1..1.0
        run(name="a.Slow", runtime=float(seconds), wait=seconds / 10, ago=600)
    run(name="a.Slow", state="FAILED", runtime=20.0, wait=2.0, ago=1200)
    run(name="a.Slow", queue="other", runtime=1.0, ago=600)
    run(name="a.Fast", runtime=0.5, ago=600)
    run(name="a.Fast", runtime=100.0, ago=2 * 86400)  # outside 24h, inside 7d
    day = {(r["name"], r["queue"]): r for r in history.run_statistics("24h")}
    slow = day[("a.Slow", "default")]
    runtimes = [float(s) for s in range(1, 11)] + [20.0]
    assert (slow["runs"], slow["failures"]) == (11, 1)
    assert slow["runtime_p50"] == pytest.approx(history.percentile(runtimes, 0.5)) == 6.0
    assert slow["runtime_p95"] == pytest.approx(15.0)
    assert slow["runtime_max"] == 20.0 and slow["wait_max"] == 2.0
    assert slow["wait_p50"] == pytest.approx(0.6)
    assert day[("a.Slow", "other")]["runs"] == 1
    assert day[("a.Fast", "default")]["runtime_max"] == 0.5
    assert list(day) == [("a.Slow", "default"), ("a.Slow", "other"), ("a.Fast", "default")]
    hour = history.run_statistics("1h")
    assert {r["name"] for r in hour} == {"a.Slow", "a.Fast"}
    assert sum(r["runs"] for r in hour) == 13
    week = {(r["name"], r["queue"]): r for r in history.run_statistics("7d")}
    assert week[("a.Fast", "default")]["runtime_max"] == 100.0
    with pytest.raises(ValueError, match="Unknown window '2h'"):
        history.run_statistics("2h")


def recorded(name="a.Job", queue="default", state="DONE", runtime=1.0, wait=0.5, ago=60.0):
    """A run as a worker's flush writes it (:func:`history.insert_runs`: statistics too)."""
    row = FakeRow(name=name, queue=queue)
    row.reserved_at = row.available_at + datetime.timedelta(seconds=wait)
    return history.run_of("w1", history.note_of(
        row, state, runtime, "E: x" if state == "FAILED" else "",
        ended=(timezone.now() - datetime.timedelta(seconds=ago)).timestamp()))


def test_statistics_from_the_histograms_agree_with_the_exact_ones():
    runs = [recorded(name="a.Slow", runtime=0.01 * (1 + n % 97), wait=0.002 * (n % 13),
                     ago=30 + n) for n in range(600)]
    runs += [recorded(name="a.Slow", state="FAILED", runtime=5.0, wait=1.0, ago=400)]
    runs += [recorded(name="a.Fast", queue="other", runtime=0.003, wait=0.0, ago=n * 60)
             for n in [*range(1, 59), *range(62, 200)]]  # none in the 1 h edge's minute
    runs += [recorded(name="a.Old", runtime=2.0, ago=3 * 86400)]  # in 7 d only
    history.insert_runs(runs)
    for window in history.WINDOWS:
        exact = {(r["name"], r["queue"]): r for r in history.run_statistics(window)}
        estimated = history.run_statistics(window, exact_up_to=0)
        assert all(r["estimated"] for r in estimated)
        assert not any(r["estimated"] for r in exact.values())
        assert {(r["name"], r["queue"]) for r in estimated} == set(exact), window
        for row in estimated:
            truth = exact[(row["name"], row["queue"])]
            # Counts and max exact (minute rows at the window's edges: the runs here are
            # not within a minute of them).
            for key in ("runs", "failures", "runtime_max", "wait_max"):
                assert row[key] == pytest.approx(truth[key]), (window, row, truth)
            for key in ("runtime_p50", "runtime_p95", "wait_p50", "wait_p95"):
                if truth[key] is None or truth[key] < history.BUCKET_FLOOR:
                    assert (row[key] or 0.0) <= history.BUCKET_FLOOR, (window, key, row)
                else:
                    assert row[key] == pytest.approx(truth[key], rel=0.1), (window, key, row)
    hour = {r["name"]: r for r in history.run_statistics("1h", exact_up_to=0)}
    assert hour["a.Fast"]["runs"] == 58 and hour["a.Slow"]["runs"] == 601
    assert set(hour) == {"a.Slow", "a.Fast"}
    same = history.run_statistics("24h", exact_up_to=0)
    fast = next(r for r in same if r["name"] == "a.Fast")
    assert fast["runtime_p50"] == fast["runtime_p95"] == fast["runtime_max"] == 0.003


def test_histogram_buckets_and_percentiles():
    assert history.bucket_of(0.0) == 0 and history.bucket_of(0.00009) == 0
    for value in (0.0001, 0.0123, 1.0, 3600.0):
        low, high = history.bucket_bounds(history.bucket_of(value))
        assert low <= value < high and high / low == pytest.approx(history.BUCKET_FACTOR)
    assert history.bucket_of(1e12) == history.LAST_BUCKET
    assert history.histogram_percentile({}, 0.5, None, None) is None
    one = {history.bucket_of(2.0): 1}
    assert history.histogram_percentile(one, 0.95, 2.0, 2.0) == 2.0
    spread = {history.bucket_of(1.0): 50, history.bucket_of(100.0): 50}
    assert history.histogram_percentile(spread, 0.5, 1.0, 100.0) == pytest.approx(1.0, rel=0.1)
    assert history.histogram_percentile(spread, 0.95, 1.0, 100.0) \
        == pytest.approx(100.0, rel=0.1)


def test_statistics_are_rebuilt_from_the_runs_and_pruned_with_them():
    history.insert_runs([recorded(ago=60), recorded(state="FAILED", ago=3 * 86400)])
    before = sorted(RunStatistic.objects.values_list(*history.STATISTIC_COLUMNS))
    assert history.rebuild_statistics() == 2
    assert sorted(RunStatistic.objects.values_list(*history.STATISTIC_COLUMNS)) == before
    with history_settings("all", HISTORY_RETENTION_DAYS=2):
        history.prune_statistics()
    left = RunStatistic.objects.filter(bucket=history.SUMMARY)
    assert sorted(left.values_list("span", "runs", "failures")) == [(60, 1, 0), (3600, 1, 0)]


def test_percentile_interpolates_like_percentile_cont():
    assert history.percentile([], 0.5) is None
    assert history.percentile([3.0], 0.95) == 3.0
    assert history.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert history.percentile([4.0, 1.0, 3.0, 2.0], 0.95) == pytest.approx(3.85)


# -- settings check ------------------------------------------------------------------------


def test_an_unknown_history_mode_is_refused_by_name():
    with history_settings("everything"):
        errors = [e for e in check_settings() if e.id == "jobguard.E150"]
    assert len(errors) == 1 and "'everything'" in errors[0].msg and "'failures'" in errors[0].msg
    with history_settings("failures"):
        assert not [e for e in check_settings() if e.id == "jobguard.E150"]


# -- the API ------------------------------------------------------------------------------


@pytest.fixture
def api(admin_user) -> APIClient:
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


def test_api_lists_filters_and_shows_runs(api):
    old = run(name="a.Sync", arguments={"args": [9], "kwargs": {"customer": "acme"}}, ago=7200)
    new = run(name="a.Sync", state="FAILED", error="RuntimeError: x", ago=60)
    run(name="b.Other", ago=30)
    listed = api.get(API + "runs/").json()
    assert listed["count"] == 3 and listed["results"][0]["name"] == "b.Other"
    by_name = api.get(API + "runs/", {"name": "a.Sync"}).json()
    assert [r["id"] for r in by_name["results"]] == [new.id, old.id]
    assert [r["id"] for r in api.get(API + "runs/", {"state": "FAILED"}).json()["results"]] \
        == [new.id]
    assert [r["id"] for r in api.get(API + "runs/", {"arguments": "acme"}).json()["results"]] \
        == [old.id]
    since = (timezone.now() - datetime.timedelta(hours=1)).isoformat()
    assert api.get(API + "runs/", {"since": since}).json()["count"] == 2
    assert api.get(API + "runs/", {"until": since}).json()["count"] == 1
    one = api.get(f"{API}runs/{new.id}/").json()
    assert (one["job_id"], one["state"], one["error"]) == (str(new.job_id), "FAILED",
                                                           "RuntimeError: x")
    assert api.get(API + "runs/", {"page_size": 1}).json()["next"]


def test_api_refuses_bad_run_filters_by_name(api):
    assert_error(api.get(API + "runs/", {"state": "RELEASED"}), 400)
    body = assert_error(api.get(API + "runs/", {"since": "2026-01-02T00:00:00Z",
                                                "until": "2026-01-01T00:00:00Z"}), 400)
    assert "until" in str(body)
    assert_error(api.get(API + "runs/", {"stat": "DONE"}), 400, "unknown_field")
    assert_error(api.get(API + "runs/statistics/", {"window": "2h"}), 400)
    assert_error(api.get(API + "runs/999999/"), 404, "not_found")


def test_api_statistics(api):
    run(name="a.Job", runtime=2.0, ago=60), run(name="a.Job", state="FAILED", runtime=4.0, ago=60)
    body = api.get(API + "runs/statistics/", {"window": "1h"}).json()
    assert body["window"] == "1h"
    (only,) = body["classes"]
    assert (only["name"], only["runs"], only["failures"], only["runtime_max"]) == (
        "a.Job", 2, 1, 4.0)
    assert only["runtime_p50"] == pytest.approx(3.0)
    assert api.get(API + "runs/statistics/").json()["window"] == "24h"


def test_api_runs_need_the_view_permission():
    client = APIClient()
    client.force_authenticate(user_with("ops", "view_queuedjob", staff=True))
    assert_error(client.get(API + "runs/"), 403, "permission_denied")
    client.force_authenticate(user_with("viewer", "view_finishedrun", staff=True))
    assert client.get(API + "runs/").status_code == 200
    assert client.get(API + "runs/statistics/").status_code == 200


# -- the admin ----------------------------------------------------------------------------

RUNS = "/admin/django_jobguard/finishedrun/"


def test_admin_lists_searches_and_shows_runs_read_only(admin_client):
    mine = run(name="a.Invoice", arguments={"args": [4711], "kwargs": {}}, ago=60)
    run(name="a.Other", state="FAILED", error="RuntimeError: nope", ago=60)
    page = admin_client.get(RUNS)
    assert page.status_code == 200 and b"a.Invoice" in page.content and b"4711" in page.content
    found = admin_client.get(RUNS, {"q": "4711"})
    assert b"a.Invoice" in found.content and b"a.Other" not in found.content
    failed = admin_client.get(RUNS, {"state__exact": "FAILED"})
    assert b"a.Other" in failed.content and b"a.Invoice" not in failed.content
    detail = admin_client.get(f"{RUNS}{mine.id}/change/")
    assert detail.status_code == 200 and b"4711" in detail.content
    assert b'name="_save"' not in detail.content
    assert admin_client.get(f"{RUNS}add/").status_code == 403
    assert admin_client.post(f"{RUNS}{mine.id}/delete/").status_code == 403


def test_admin_finds_a_job_id_or_a_job_name_by_index_and_other_text_as_before(admin_client):
    mine = run(name="a.Invoice", arguments={"args": [4711], "kwargs": {}}, ago=60)
    other = run(name="a.Other", arguments={"args": [str(mine.job_id)], "kwargs": {}}, ago=30)
    with CaptureQueriesContext(connection) as queries:
        found = admin_client.get(RUNS, {"q": str(mine.job_id)})
    assert list(found.context["cl"].result_list) == [mine]  # not the run naming it in its args
    assert not [q for q in queries.captured_queries if "LIKE" in q["sql"].upper()]
    with CaptureQueriesContext(connection) as queries:
        named = admin_client.get(RUNS, {"q": "a.Other"})
    assert list(named.context["cl"].result_list) == [other]
    assert not [q for q in queries.captured_queries if "LIKE" in q["sql"].upper()]
    assert list(admin_client.get(RUNS, {"q": "Invoi"}).context["cl"].result_list) == [mine]
    assert list(admin_client.get(RUNS, {"q": "4711"}).context["cl"].result_list) == [mine]
    assert list(admin_client.get(RUNS, {"q": "a.Other 4711"}).context["cl"].result_list) == []


def test_admin_list_counts_exactly_up_to_the_limit_then_estimates_on_postgresql(
        admin_client, monkeypatch):
    from django_jobguard.admin.base import EstimatedCountPaginator

    history.insert_runs([recorded(name=f"a.Job{n % 3}", queue=("mail", "pdf")[n % 2],
                                  state="FAILED" if n % 5 == 0 else "DONE", ago=60 + n)
                         for n in range(30)])
    page = admin_client.get(RUNS)
    assert page.context["cl"].result_count == 30 and not page.context["cl"].paginator.estimated
    assert "about" not in page.content.decode().split('class="paginator"')[1]
    filters = {spec.title: [choice["display"] for choice in spec.choices(page.context["cl"])]
               for spec in page.context["cl"].filter_specs}
    assert {"mail", "pdf"} <= set(filters["queue"]) and "FAILED" in filters["state"]
    monkeypatch.setattr(EstimatedCountPaginator, "exact_up_to", 10)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(RUNS)
    cl = page.context["cl"]
    if connection.vendor == "postgresql":  # the planner's estimate, never under the limit
        assert cl.paginator.estimated and cl.result_count > 10
        assert not [q for q in queries.captured_queries
                    if q["sql"].upper().startswith("SELECT COUNT(*) AS")]  # no COUNT(*)
        assert f"about {cl.result_count}" in page.content.decode()
    else:  # an exact count elsewhere
        assert not cl.paginator.estimated and cl.result_count == 30
    failed = admin_client.get(RUNS, {"state__exact": "FAILED", "queue__exact": "mail"})
    assert failed.context["cl"].result_count == 3 and not failed.context["cl"].paginator.estimated


# -- the dashboard ------------------------------------------------------------------------

DASHBOARD = "/admin/django_jobguard/dashboard/"


def test_dashboard_shows_job_classes_slowest_or_most_failing_first(admin_client):
    run(name="a.Slow", runtime=30.0, ago=60)
    run(name="a.Flaky", runtime=0.5, state="FAILED", ago=60)
    run(name="a.Flaky", runtime=0.25, state="FAILED", ago=60)
    run(name="a.Old", runtime=99.0, ago=2 * 86400)
    with history_settings("all"):
        page = admin_client.get(DASHBOARD)
        text = page.content.decode()
        assert page.status_code == 200 and 'id="jobguard-classes"' in text
        assert text.index('data-class="a.Slow"') < text.index('data-class="a.Flaky"')
        assert "a.Old" not in text  # outside the default 24h window
        assert "0.375 s / 0.487 s / 0.5 s" in text  # a.Flaky's runtime p50 / p95 / max
        failing = admin_client.get(DASHBOARD, {"sort": "failures"}).content.decode()
        assert failing.index('data-class="a.Flaky"') < failing.index('data-class="a.Slow"')
        assert "state__exact=FAILED" in failing
        week = admin_client.get(DASHBOARD, {"window": "7d"}).content.decode()
        assert 'data-class="a.Old"' in week
        bad = admin_client.get(DASHBOARD, {"window": "2h"}, follow=True).content.decode()
        assert "Unknown window &#x27;2h&#x27;" in bad and 'data-class="a.Slow"' in bad
        runs = admin_client.get("/admin/django_jobguard/finishedrun/",
                                {"name": "a.Flaky", "queue__exact": "default",
                                 "state__exact": "FAILED"})
        assert runs.status_code == 200 and b"a.Flaky" in runs.content
        assert b"a.Slow" not in runs.content
    assert 'id="jobguard-classes"' not in admin_client.get(DASHBOARD).content.decode()  # off


# -- the arguments preview column (issue 31 C) ----------------------------------------------


def test_arguments_preview_reads_like_a_call_and_is_cut_with_the_whole_text_as_tooltip():
    from django_jobguard.admin.base import PREVIEW_CHARS, arguments_preview, arguments_text

    assert arguments_text({"args": [9, "x"], "kwargs": {"notify": True}}) == \
        '9, "x", notify=true'
    assert arguments_text({"args": [], "kwargs": {}}) == "" and arguments_preview({}) == "-"
    assert arguments_text("not a payload") == ""
    long = {"args": ["<b>" + "a" * 100 + "</b>"], "kwargs": {}}
    shown = str(arguments_preview(long))
    assert "&lt;b&gt;" in shown and "<b>" not in shown  # escaped
    import html

    cut = html.unescape(shown.split(">", 1)[1].rsplit("<", 1)[0])
    assert cut.endswith("…") and len(cut) == PREVIEW_CHARS
    assert 'title="&quot;&lt;b&gt;' + "a" * 100 in shown


def test_job_lists_show_the_arguments_column(admin_client):
    from tests.support.operate import failed_job

    jobs.Noop(4711).dispatch()
    failed_job()  # args ["x"]
    queued = admin_client.get("/admin/django_jobguard/queuedjob/").content.decode()
    assert 'class="jobguard-args" title="4711">4711</code>' in queued
    failed = admin_client.get("/admin/django_jobguard/failedjob/").content.decode()
    assert 'class="jobguard-args" title="&quot;x&quot;">&quot;x&quot;</code>' in failed
    run(arguments={"args": [], "kwargs": {"customer_id": 9}})
    runs = admin_client.get(RUNS).content.decode()
    assert 'title="customer_id=9">customer_id=9</code>' in runs
