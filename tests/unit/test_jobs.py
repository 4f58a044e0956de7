"""The Job API: dispatch, payloads, function jobs, transactions."""

from __future__ import annotations

import datetime
import decimal
import uuid

import pytest
from demo.models import Profile
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobguard import Job, dispatch, dispatch_many, dispatch_sync, job, registry
from django_jobguard.envelope import Envelope
from django_jobguard.models import QueuedJob
from django_jobguard.registry import UnknownJobError
from tests.support import jobs, work


@pytest.fixture(autouse=True)
def _clear_calls():
    jobs.CALLS.clear()


@pytest.mark.django_db
def test_dispatch_stores_constructor_arguments_as_json():
    handle = jobs.Record("hello", key="k1").dispatch()
    assert handle and handle.id
    row = QueuedJob.objects.get(id=handle.id)
    assert row.name == "tests.support.jobs.Record"
    assert row.queue == "default"
    assert row.payload["args"] == ["hello"]
    assert row.payload["kwargs"] == {"key": "k1"}
    assert row.attempts == 0 and row.reserved_at is None


@pytest.mark.django_db
def test_dispatch_options_queue_priority_delay():
    handle = dispatch(jobs.Noop(1), queue="high", priority=10, delay=60)
    row = QueuedJob.objects.get(id=handle.id)
    assert (row.queue, row.priority) == ("high", 10)
    assert row.available_at > timezone.now() + datetime.timedelta(seconds=50)
    when = timezone.now() + datetime.timedelta(hours=1)
    row2 = QueuedJob.objects.get(id=jobs.Noop(2).dispatch(delay=when).id)
    assert abs((row2.available_at - when).total_seconds()) < 1


@pytest.mark.django_db
def test_dispatch_many_with_a_delay_per_row():
    """The batch insert (one statement for many rows) places each row's delay like the
    single-row insert does: seconds on the database clock, or an absolute time."""
    when = timezone.now() + datetime.timedelta(hours=2)
    now = dispatch_many([jobs.Noop(0)])[0]
    seconds = dispatch_many([jobs.Noop(1), jobs.Noop(2)], delay=60)
    at = dispatch_many([jobs.Noop(3), jobs.Noop(4)], delay=when)
    rows = {str(r.id): r.available_at for r in QueuedJob.objects.all()}
    assert rows[now.id] <= timezone.now()
    for handle in seconds:
        assert 50 < (rows[handle.id] - timezone.now()).total_seconds() <= 60
    for handle in at:
        assert abs((rows[handle.id] - when).total_seconds()) < 1


@pytest.mark.django_db
def test_non_json_argument_raises_type_error_naming_it_and_queues_nothing():
    with pytest.raises(TypeError, match=r"Job argument seconds is a builtins.object"):
        jobs.Record("x", seconds=object()).dispatch()
    with pytest.raises(TypeError, match=r"args\[0\]\['k'\]"):
        jobs.Noop({"k": {1, 2}}).dispatch()
    assert QueuedJob.objects.count() == 0


@pytest.mark.django_db
def test_tagged_types_round_trip():
    value = {"when": timezone.now(), "day": datetime.date(2026, 1, 2), "id": uuid.uuid4(),
             "price": decimal.Decimal("1.10"), "span": datetime.timedelta(seconds=5)}
    row = QueuedJob.objects.get(id=jobs.Noop(value).dispatch().id)
    rebuilt = jobs.Noop.from_envelope(Envelope.decode(row.payload))
    assert rebuilt.n == value


@pytest.mark.django_db
def test_model_argument_travels_as_reference():
    profile = Profile.objects.create(name="ann")
    row = QueuedJob.objects.get(id=jobs.SyncProfileById(profile).dispatch().id)
    assert row.payload["args"] == [{"__jobguard__": "model", "model": "demo.profile",
                                    "pk": profile.pk}]
    assert jobs.SyncProfileById.from_envelope(Envelope.decode(row.payload)).profile == profile
    with pytest.raises(TypeError, match="unsaved Profile"):
        jobs.SyncProfileById(Profile(name="new")).dispatch()


@pytest.mark.django_db
def test_payload_size_limit():
    with (override_settings(JOBGUARD={"MAX_PAYLOAD_BYTES": 100}),
          pytest.raises(ValueError, match="over JOBGUARD\\['MAX_PAYLOAD_BYTES'\\] = 100")):
        jobs.Noop("x" * 200).dispatch()
    assert not QueuedJob.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("args", "kwargs", "where", "what"), [
    ([float("nan")], {}, "args[0]", "nan"),
    ([], {"n": float("inf")}, "Job argument n ", "inf"),
    ([[1, {"x": -float("inf")}]], {}, "args[0][1]['x']", "-inf"),
    (["a\x00b"], {}, "args[0]", "NUL character"),
    ([{"k\x00": 1}], {}, "a key of args[0]", "NUL character"),
    ([], {"n": ["ok", "\ud800"]}, "n[1]", "lone surrogate"),
    ([{"\udfff": 1}], {}, "a key of args[0]", "lone surrogate"),
])
def test_values_no_database_stores_alike_are_refused_naming_the_argument(args, kwargs, where,
                                                                        what):
    """Refused before the database sees them (PostgreSQL would abort the caller's transaction
    with a DataError naming nothing; SQLite would store them): the same on every backend."""
    with transaction.atomic():
        with pytest.raises(ValueError) as caught:
            jobs.Noop(*args, **kwargs).dispatch()
        assert where in str(caught.value) and what in str(caught.value), str(caught.value)
        jobs.Noop(1).dispatch()  # the caller's transaction is still usable
    assert QueuedJob.objects.count() == 1


@pytest.mark.django_db
def test_payload_size_limit_counts_the_stored_utf8_bytes():
    text = "é" * 300  # 600 bytes of UTF-8; 1,800 as ASCII-escaped JSON
    with override_settings(JOBGUARD={"MAX_PAYLOAD_BYTES": 700}):
        row = QueuedJob.objects.get(id=jobs.Noop(text).dispatch().id)
        with pytest.raises(ValueError, match="is 7[0-9][0-9] bytes, over"):
            jobs.Noop(text + "é" * 50).dispatch()
        assert row.payload["args"] == [text]
        assert work() == ["DONE"]  # the worker measures it the same way


@pytest.mark.django_db
def test_priority_out_of_range():
    with pytest.raises(ValueError, match="between -100 and 100"):
        jobs.Noop().dispatch(priority=101)


@pytest.mark.django_db(transaction=True)
def test_dispatch_joins_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.Noop().dispatch()
        assert QueuedJob.objects.count() == 1
        raise RuntimeError("rollback")
    assert QueuedJob.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_on_commit_inserts_after_commit():
    with transaction.atomic():
        handle = jobs.Noop().dispatch(on_commit=True)
        assert not QueuedJob.objects.filter(id=handle.id).exists()
    assert QueuedJob.objects.filter(id=handle.id).exists()


@pytest.mark.django_db
def test_dispatch_many_uses_one_insert():
    with CaptureQueriesContext(connection) as ctx:
        handles = dispatch_many([jobs.Noop(i) for i in range(50)])
    statements = [q["sql"].upper() for q in ctx.captured_queries]
    assert sum("INSERT INTO" in sql for sql in statements) == 1
    if connection.vendor == "postgresql":  # the NOTIFY rides in the INSERT's round trip
        assert len(statements) == 1
    assert len(handles) == 50 and all(handles)
    assert QueuedJob.objects.count() == 50


def test_dispatch_sync_runs_inline_without_queueing():
    assert dispatch_sync(jobs.Noop(7)) == 7
    assert jobs.add.dispatch_sync(2, 3) == 5


@pytest.mark.django_db
def test_function_job_dispatch_and_options():
    handle = jobs.add.dispatch(1, b=2)
    row = QueuedJob.objects.get(id=handle.id)
    assert (row.name, row.queue) == ("tests.support.jobs.add", "functions")
    assert row.payload == {"args": [1], "kwargs": {"b": 2}}
    later = jobs.add.using(delay=30, queue="other").dispatch(1, 1)
    assert QueuedJob.objects.get(id=later.id).queue == "other"
    assert jobs.add(2, 2) == 4  # still a plain function
    assert jobs.add.job_class.tries == 2


def test_job_decorator_rejects_nested_functions_and_unknown_options():
    with pytest.raises(TypeError, match="module-level"):
        @job
        def inner():
            pass
    with pytest.raises(TypeError, match="unknown options"):
        job(retries=3)


def test_registry_rejects_a_second_class_with_the_same_name():
    with pytest.raises(ValueError, match="already used"):
        type("Impostor", (Job,), {"name": "tests.support.jobs.Noop", "__module__": "elsewhere"})


def test_registry_unknown_name_is_readable():
    with pytest.raises(UnknownJobError, match="No job is registered as 'gone.Job'"):
        registry.get("gone.Job")
