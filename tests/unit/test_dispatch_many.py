"""``dispatch_many`` (issue 29): rows built with what a call and a class share worked out
once, each still checked as a single ``dispatch()`` checks it, the payload of a plain job
encoded without an ``Envelope``, the ids from one read of the random source and the
handles made without the frozen dataclass's ``__init__``; none of it changes a row, a
handle, an error or a signal."""

from __future__ import annotations

import datetime
import json
import pickle
import uuid

import pytest
from django.test import override_settings
from django.utils import timezone

from django_jobguard import (
    Job,
    ShouldBeUnique,
    carriers,
    dispatch,
    dispatch_many,
    durations,
    signals,
)
from django_jobguard.conf import jobguard_settings
from django_jobguard.envelope import Envelope
from django_jobguard.jobs import Dispatched, _new_ids, _Rows, build_row
from django_jobguard.models import QueuedJob
from tests.support import jobs

pytestmark = pytest.mark.django_db

DEADLINE = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


class Mailing(Job):
    name = "tests.dispatch_many.Mailing"
    tags = ["mail"]
    priority = 5

    def __init__(self, to: str, *, when: datetime.datetime | None = None,
                 tenant: str = "") -> None:
        self.to, self.when, self.tenant = to, when, tenant

    def fair_key(self) -> str:
        return self.tenant

    def retry_until(self) -> datetime.datetime | None:
        return DEADLINE if self.to.startswith("late") else None

    def handle(self) -> None:
        pass


class Routed(Job):
    """Its queue comes from its own ``queue_name``, not from ``queue``."""

    name = "tests.dispatch_many.Routed"

    def __init__(self, region: str) -> None:
        self.region = region

    @property
    def queue_name(self) -> str:
        return f"region-{self.region}"

    def handle(self) -> None:
        pass


class Stamped(Job):
    """Adds an entry of its own to its envelope (a subclass's ``to_envelope``)."""

    name = "tests.dispatch_many.Stamped"

    def to_envelope(self, *, unique=None) -> Envelope:
        envelope = super().to_envelope(unique=unique)
        return envelope.replace(extra={"stamp": "yes"})

    def handle(self) -> None:
        pass


class OnlyOne(ShouldBeUnique, Job):
    name = "tests.dispatch_many.OnlyOne"

    def __init__(self, key: str) -> None:
        self.key = key

    def unique_id(self) -> str:
        return self.key

    def handle(self) -> None:
        pass


def mixed_jobs() -> list[Job]:
    late = jobs.Noop(3)
    late.priority = -7  # an instance's own priority
    elsewhere = jobs.Noop(4)
    elsewhere.queue = "elsewhere"  # an instance's own queue
    return [jobs.Noop(), jobs.Noop(1), jobs.Record("x", key="k", seconds=0.5), late, elsewhere,
            Mailing("a@example.com", tenant="t1"), Mailing("late@example.com", tenant="t2",
                                                           when=DEADLINE),
            Routed("eu"), Routed("us"), Stamped(), jobs.add.job_class(1, b=2),
            jobs.Noop({"day": datetime.date(2026, 1, 2), "id": uuid.UUID(int=7), "é": "ü"})]


@pytest.mark.parametrize("options", [{}, {"tags": ["bulk"], "priority": 9},
                                     {"queue": "chosen", "fair_key": "k", "delay": 30}])
def test_every_row_is_what_build_row_makes_of_its_job(options):
    """The rows built for many jobs at once (plain payloads encoded without an envelope,
    per-class tags and checks cached) hold exactly what the one-job builder gives, which
    makes an ``Envelope`` for each: payload text, queue, name, priority, tags, fair key."""
    when = durations.due(options.get("delay"))
    call = {key: value for key, value in options.items() if key != "delay"}
    with carriers.correlation("req-1"):
        context = carriers.capture()
        rows = _Rows(len(mixed_jobs()), context=context, **{
            "queue": None, "priority": None, "tags": None, "fair_key": None, **call})
        built = [rows.build(job, when) for job in mixed_jobs()]
        expected = [build_row(job, when=when, **call)[0] for job in mixed_jobs()]
    assert context == {"correlation_id": "req-1"}
    for row, reference in zip(built, expected, strict=True):
        assert (row.payload, row.name, row.queue, row.priority, row.tags, row.fair_key,
                row.at, row.delay) == (
            reference.payload, reference.name, reference.queue, reference.priority,
            reference.tags, reference.fair_key, reference.at, reference.delay)
    # An envelope was built only where the job's class needs one (its own to_envelope).
    assert [envelope is not None for envelope in rows.envelopes] == [
        isinstance(job, Stamped) for job in mixed_jobs()]


def test_a_unique_job_among_plain_ones_gets_its_lock_in_its_envelope():
    rows = _Rows(2, queue=None, priority=None, tags=None, fair_key=None, context={})
    plain = rows.build(jobs.Noop(1), durations.NOW)
    unique = rows.build(OnlyOne("a"), durations.NOW)
    assert rows.envelopes[0] is None
    ref = rows.envelopes[1].unique
    assert ref is not None and ref.owner == str(unique.id)
    assert Envelope.decode(json.loads(unique.payload)).unique == ref
    assert plain.id != unique.id


def test_many_jobs_are_stored_routed_and_tagged_each_as_its_own():
    handles = dispatch_many(mixed_jobs(), tags=["bulk"])
    rows = {str(row.id): row for row in QueuedJob.objects.all()}
    stored = [rows[handle.id] for handle in handles]
    assert [row.queue for row in stored] == [
        "default", "default", "default", "default", "elsewhere", "default", "default",
        "region-eu", "region-us", "default", "functions", "default"]
    assert [row.priority for row in stored] == [0, 0, 0, -7, 0, 5, 5, 0, 0, 0, 0, 0]
    assert {row.tags for row in stored[5:7]} == {",mail,bulk,"}
    assert {row.tags for row in stored[:5] + stored[7:]} == {",bulk,"}
    assert [row.fair_key for row in stored[5:7]] == ["t1", "t2"]
    assert stored[0].payload == {"args": [], "kwargs": {}}
    assert stored[2].payload == {"args": ["x"], "kwargs": {"key": "k", "seconds": 0.5}}
    assert stored[6].payload["retry_until"] == DEADLINE.isoformat()
    assert "retry_until" not in stored[5].payload
    assert stored[9].payload["stamp"] == "yes"
    assert jobs.Noop.from_envelope(Envelope.decode(stored[11].payload)).n == {
        "day": datetime.date(2026, 1, 2), "id": uuid.UUID(int=7), "é": "ü"}


def test_the_handles_are_the_dataclass_they_always_were():
    handles = dispatch_many([jobs.Noop(1), Mailing("b@example.com")])
    assert handles == [Dispatched(id=h.id, job_name=name, queue="default", using="default")
                       for h, name in zip(handles, [jobs.Noop.name, Mailing.name],
                                          strict=True)]
    first = handles[0]
    assert first and first.skipped is None and first.folded is False
    assert first.using == "default"
    assert repr(first) == repr(Dispatched(id=first.id, job_name=jobs.Noop.name,
                                          queue="default"))
    assert hash(first) == hash(Dispatched(id=first.id, job_name=jobs.Noop.name,
                                          queue="default"))
    assert pickle.loads(pickle.dumps(first)) == first
    with pytest.raises(AttributeError):
        first.id = "other"  # type: ignore[misc]


def test_the_ids_are_random_version_4_uuids():
    ids = _new_ids(1_000)
    assert len(set(ids)) == 1_000
    assert {(i.version, i.variant) for i in ids} == {(4, uuid.RFC_4122)}
    assert [(i.version, i.variant) for i in _new_ids(1)] == [(4, uuid.RFC_4122)]
    assert _new_ids(0) == []
    handles = dispatch_many([jobs.Noop(i) for i in range(20)])
    assert {uuid.UUID(h.id).version for h in handles} == {4}


@pytest.mark.parametrize(("bad", "error", "message"), [
    (lambda: jobs.Noop(object()), TypeError, r"Job argument args\[0\] is a builtins\.object"),
    (lambda: jobs.Noop("nul\x00"), ValueError, r"args\[0\] contains a NUL character"),
    (lambda: Mailing("late", when=datetime.datetime(2030, 1, 1)), TypeError,
     r"Mailing\.retry_until\(\) must return an aware datetime"),
    (lambda: Routed("with space"), ValueError, r"'region-with space' is not a queue name"),
    (lambda: jobs.Noop("x" * 3_000), ValueError, r"payload is \d+ bytes, over"),
])
def test_a_bad_job_among_many_raises_what_dispatch_raises_and_queues_nothing(
        bad, error, message, monkeypatch):
    if isinstance(bad(), Mailing):  # a naive deadline: its retry_until returns it as given
        monkeypatch.setattr(Mailing, "retry_until", lambda self: self.when)
    limited = {**jobguard_settings.user_settings, "MAX_PAYLOAD_BYTES": 2_000}
    with override_settings(JOBGUARD=limited):
        with pytest.raises(error, match=message):
            dispatch(bad())
        with pytest.raises(error, match=message):
            dispatch_many([jobs.Noop(1), Mailing("a@example.com"), bad(), jobs.Noop(2)])
    assert QueuedJob.objects.count() == 0


def test_a_priority_out_of_range_names_it_for_the_first_job():
    shouting = jobs.Noop(2)
    shouting.priority = 101
    with pytest.raises(ValueError, match="priority must be between -100 and 100, not 101"):
        dispatch_many([jobs.Noop(1), shouting])
    with pytest.raises(ValueError, match="priority must be between -100 and 100, not -200"):
        dispatch_many([jobs.Noop(1)], priority=-200)
    assert QueuedJob.objects.count() == 0


def test_job_dispatched_reaches_the_receivers_of_each_class():
    for_noop: list[dict] = []
    for_all: list[dict] = []
    inserted: list[list[str]] = []

    def on_noop(sender, **kwargs):
        for_noop.append({"sender": sender, **kwargs})

    def on_any(sender, **kwargs):
        for_all.append({"sender": sender, **kwargs})

    def on_inserted(sender, job_ids, **kwargs):
        inserted.append(job_ids)

    signals.job_dispatched.connect(on_noop, sender=jobs.Noop)
    signals.job_dispatched.connect(on_any)
    signals.jobs_inserted.connect(on_inserted)
    try:
        handles = dispatch_many([jobs.Noop(1), Mailing("c@example.com"), jobs.Noop(2)],
                                delay=60)
    finally:
        signals.job_dispatched.disconnect(on_noop, sender=jobs.Noop)
        signals.job_dispatched.disconnect(on_any)
        signals.jobs_inserted.disconnect(on_inserted)
    assert [(s["sender"], s["job_id"]) for s in for_noop] == [
        (jobs.Noop, handles[0].id), (jobs.Noop, handles[2].id)]
    assert [(s["sender"], s["job_id"], s["queue"], s["priority"], s["delay"], s["at"])
            for s in for_all] == [
        (jobs.Noop, handles[0].id, "default", 0, 60.0, None),
        (Mailing, handles[1].id, "default", 5, 60.0, None),
        (jobs.Noop, handles[2].id, "default", 0, 60.0, None)]
    assert inserted == [[h.id for h in handles]]


def test_a_context_captured_at_dispatch_is_in_every_plain_payload():
    with carriers.correlation("req-9"):
        handles = dispatch_many([jobs.Noop(), jobs.Noop(1), Mailing("late@example.com")])
    payloads = [QueuedJob.objects.get(id=h.id).payload for h in handles]
    assert [p["context"] for p in payloads] == [{"correlation_id": "req-9"}] * 3


def test_an_aware_deadline_in_another_zone_is_kept_as_given(scratch_jobs):
    """The plain payload writes ``retry_until`` as the envelope does (``isoformat()``)."""
    tokyo = datetime.timezone(datetime.timedelta(hours=9))
    when = timezone.now().astimezone(tokyo) + datetime.timedelta(days=1)

    class Later(Job):
        name = "tests.dispatch_many.Later"

        def retry_until(self):
            return when

        def handle(self):
            pass

    (handle,) = dispatch_many([Later()])
    assert QueuedJob.objects.get(id=handle.id).payload["retry_until"] == when.isoformat()
    assert build_row(Later())[1].retry_until == when


def test_no_jobs_queue_nothing_and_send_nothing(django_assert_num_queries):
    inserted: list[list[str]] = []

    def on_inserted(sender, job_ids, **kwargs):
        inserted.append(job_ids)

    signals.jobs_inserted.connect(on_inserted)
    try:
        with django_assert_num_queries(0):
            assert dispatch_many([]) == []
            assert dispatch_many(job for job in ()) == []
    finally:
        signals.jobs_inserted.disconnect(on_inserted)
    assert inserted == []
