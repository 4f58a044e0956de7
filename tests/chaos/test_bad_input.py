"""Bad rows in the queue, mixed in with good jobs, in front of real worker processes: each bad
one lands in failed jobs with a reason that names the problem, and the workers go on. Poison
rows (a counter at its maximum, a date the driver cannot load, a JSON null payload) are among
them.

(Text that is not JSON at all cannot reach a worker: PostgreSQL's jsonb and the JSON CHECK
constraint Django puts on SQLite refuse it at INSERT.)"""

from __future__ import annotations

import datetime
import uuid

import pytest
from demo.models import JobRun
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_jobguard import dispatch_many
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob
from tests.chaos.conftest import LONG_LEASE, chaos_env
from tests.support import jobs
from tests.support.poison import COLUMN_MAX, UNLOADABLE_CREATED_AT, poison_row

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RECORD = jobs.Record.name
LIMIT = 2_000  # MAX_PAYLOAD_BYTES for this test, in the test process and in the workers

# (what is wrong, job name, payload, words the failure reason must contain)
BAD_ROWS = [
    ("unknown job", "app.jobs.Gone", {"args": [], "kwargs": {}}, ["No job is registered",
                                                                  "app.jobs.Gone"]),
    ("payload not an object", RECORD, ["x"], ["Corrupt payload", "expected a JSON object"]),
    ("args not a list", RECORD, {"args": "x", "kwargs": {}}, ["'args' must be a list"]),
    # Arguments the constructor does not take wait UNKNOWN_JOB_GRACE for a worker
    # that can rebuild them (a rolling deploy; these rows are older), then fail naming it.
    ("missing argument", RECORD, {"args": [], "kwargs": {}}, ["cannot rebuild", "label"]),
    ("unknown argument", RECORD, {"args": ["a"], "kwargs": {"colour": 1}}, ["colour"]),
    ("unknown tag", RECORD, {"args": [{"__jobguard__": "pickle", "value": "x"}], "kwargs": {}},
     ["Unknown payload tag", "pickle"]),
    ("unknown model", RECORD, {"args": [{"__jobguard__": "model", "model": "nope.gone",
                                         "pk": 1}], "kwargs": {}}, ["Cannot rebuild", "nope"]),
    ("retry_until not a date", RECORD, {"args": ["a"], "kwargs": {}, "retry_until": "not-a-date"},
     ["'retry_until' must be an ISO 8601 time"]),
    ("retry_until out of range", RECORD,
     {"args": ["a"], "kwargs": {}, "retry_until": "0001-01-01T00:00:00+23:59"},
     ["'retry_until'", "out of the range of dates"]),
    ("huge payload", RECORD, {"args": ["x" * (LIMIT * 2)], "kwargs": {}},
     ["bytes, over JOBGUARD['MAX_PAYLOAD_BYTES']"]),
]


def _poison_rows() -> dict[str, tuple[str, list[str]]]:
    """Rows made poison with raw SQL (see docs/guarantees.md): {id: (what, reason words)}."""
    vendor = connection.vendor
    rows = {
        poison_row(jobs.Record("bad"), "payload", "'null'"):
            ("JSON null payload", ["Corrupt payload", "expected a JSON object"]),
        poison_row(jobs.Record("bad"), "attempts", str(COLUMN_MAX[vendor])):
            ("attempts at the maximum", ["Quarantined", "attempts reached the counter maximum"]),
        poison_row(jobs.Record("bad"), "claims", str(COLUMN_MAX[vendor])):
            ("claims at the maximum", ["Quarantined", "claims reached the counter maximum"]),
    }
    if vendor in UNLOADABLE_CREATED_AT:
        rows[poison_row(jobs.Record("bad"), "created_at", UNLOADABLE_CREATED_AT[vendor])] = (
            "created_at the driver cannot load", ["Quarantined", "created_at", "cannot be loaded"])
    return rows


def _insert(name: str, payload) -> str:
    # Queued before UNKNOWN_JOB_GRACE (10 min): an unknown name is failed, not put back.
    row = QueuedJob.objects.create(id=uuid.uuid4(), name=name, queue="default", payload=payload,
                                   created_at=timezone.now() - datetime.timedelta(minutes=11))
    return str(row.id)


def test_bad_rows_fail_with_a_reason_and_workers_keep_going(workers):
    small_limit = {**jobguard_settings.user_settings, "MAX_PAYLOAD_BYTES": LIMIT}
    with override_settings(JOBGUARD=small_limit), pytest.raises(ValueError,
                                                                 match="MAX_PAYLOAD_BYTES"):
        jobs.Record("x" * (LIMIT * 2)).dispatch()  # dispatch() refuses it
    good = [h.id for h in dispatch_many([jobs.Record("good", key=str(i)) for i in range(30)])]
    bad = {_insert(name, payload): (what, words) for what, name, payload, words in BAD_ROWS}
    bad |= _poison_rows()
    good += [h.id for h in dispatch_many([jobs.Record("good", key=f"late{i}")
                                          for i in range(30)])]

    # A long lease: this test is about bad rows, not recovery (a 2 s lease ran out under a
    # loaded CI machine once, and a good job that had run was failed by the other worker).
    env = chaos_env(JOBGUARD_MAX_PAYLOAD_BYTES=str(LIMIT), **LONG_LEASE)
    outputs = workers(2, "--stop-when-empty", "--sleep", "0.1", env=env).wait(120)

    ran = list(JobRun.objects.filter(label="good").values_list("job_id", flat=True))
    assert sorted(ran) == sorted(good)  # each once
    assert not JobRun.objects.filter(label="bad").exists()
    assert not QueuedJob.objects.exists()
    failed = {str(f.id): f for f in FailedJob.objects.all()}
    unexpected = {job_id: (f.name, f.reason, f.message[:300], f.traceback[-800:],
                           job_id in map(str, good))
                  for job_id, f in failed.items() if job_id not in bad}
    assert not unexpected, (unexpected, outputs)
    assert set(failed) == set(bad)
    for job_id, (what, words) in bad.items():
        reason = f"{failed[job_id].exception_class}: {failed[job_id].message}"
        for word in words:
            assert word in reason, (what, reason)
    assert sum(out.count(" FAILED ") for out in outputs) == len(bad)
    assert sum(out.count(" DONE ") for out in outputs) == len(good)
