"""Poison rows: a row a claim cannot count, a driver cannot load or a failed job cannot hold.

Each is written with raw SQL (dispatch() never makes one), ahead of good jobs in the same
claims; a worker drains the queue. Every good job runs once, and the poison row ends as one
failed job whose reason names what is wrong with it (docs/guarantees.md: every row reaches
one final outcome).
"""

from __future__ import annotations

import pytest
from demo.models import JobRun
from django.db import connection

from django_jobguard import dispatch_many
from django_jobguard.models import COUNTER_MAX, FailedJob, QueuedJob
from django_jobguard.operations.maintenance import quarantine_unreachable
from tests.support import jobs, work
from tests.support.poison import COLUMN_MAX, poison_row

pytestmark = pytest.mark.django_db(transaction=True)


def _poison(sql_value: str, column: str) -> str:
    """A poison row of the highest priority, so that every claim takes it first, with good
    jobs after it."""
    return poison_row(jobs.Record("poison"), column, sql_value, priority=100)


def _drain_and_check(poison_id: str, *words: str, **worker_options) -> FailedJob:
    """Dispatch 12 good jobs, drain with a worker claiming 4 rows at a time, and check that
    each good job ran once and the poison row is the only failed job, its reason naming
    ``words``."""
    good = [h.id for h in dispatch_many([jobs.Record("good", key=str(i)) for i in range(12)])]
    work(batch=4, **worker_options)
    ran = list(JobRun.objects.filter(label="good").values_list("job_id", flat=True))
    assert sorted(ran) == sorted(good)
    assert not JobRun.objects.filter(label="poison").exists()
    assert not QueuedJob.objects.exists()
    (failed,) = FailedJob.objects.all()
    assert str(failed.id) == poison_id
    text = f"{failed.reason} | {failed.exception_class}: {failed.message}"
    for word in words:
        assert word in text, text
    return failed


@pytest.mark.parametrize("column", ["attempts", "claims", "exceptions"])
def test_a_counter_at_the_column_maximum_is_quarantined(column):
    poison = _poison(str(COLUMN_MAX[connection.vendor]), column)
    _drain_and_check(poison, "quarantined", column, str(COUNTER_MAX))


@pytest.mark.parametrize("column", ["attempts", "claims"])
def test_a_counter_a_claim_brings_to_the_maximum_is_quarantined(column):
    poison = _poison(str(COUNTER_MAX - 1), column)
    _drain_and_check(poison, "quarantined", column)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_json_null_payload_is_failed_once_with_its_payload_kept(threads):
    poison = _poison("'null'", "payload")
    failed = _drain_and_check(poison, "expected a JSON object", "NoneType", threads=threads)
    assert failed.payload is None
    assert failed.attempts == 1


# (database, SQL value, column): dates each database stores and its driver cannot load.
UNLOADABLE_DATES = [
    ("postgresql", "'infinity'", "created_at"),
    ("postgresql", "'-infinity'", "created_at"),
    ("postgresql", "'10000-01-01 00:00:00+00'", "created_at"),
    ("postgresql", "'0044-03-15 00:00:00+00 BC'", "created_at"),
    ("postgresql", "'infinity'", "cancel_requested_at"),
    ("sqlite", "'infinity'", "created_at"),
    ("sqlite", "'10000-01-01 00:00:00'", "created_at"),
    ("sqlite", "'2024-13-45 00:00:00'", "created_at"),
    ("sqlite", "'soon'", "cancel_requested_at"),
    # A zero date, stored by a session without NO_ZERO_DATE (MariaDB's default sql_mode):
    # mysqlclient reads it as None.
    ("mysql", "'0000-00-00 00:00:00'", "created_at"),
]


@pytest.mark.parametrize(("vendor", "value", "column"), UNLOADABLE_DATES)
def test_a_date_the_driver_cannot_load_is_quarantined_without_costing_other_leases(
        vendor, value, column):
    if connection.vendor != vendor:
        pytest.skip(f"a {vendor} value")
    if vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = ''")
    try:
        poison = _poison(value, column)
    finally:
        if vendor == "mysql":
            connection.close()  # the next connection has the server's sql_mode again
    failed = _drain_and_check(poison, "quarantined", column, "cannot be loaded")
    assert failed.name == jobs.Record.name


def test_a_priority_out_of_range_is_refused_by_the_database():
    from django.db import IntegrityError, OperationalError

    with pytest.raises((IntegrityError, OperationalError)):
        _poison("101", "priority")


# (database, SQL value) of an available_at that no claim ever reaches and no driver loads.
NEVER_DUE = [("postgresql", "'infinity'"), ("postgresql", "'10000-01-01 00:00:00+00'"),
             ("sqlite", "'never'")]


@pytest.mark.parametrize(("vendor", "value"), NEVER_DUE)
def test_a_row_that_can_never_become_due_is_quarantined_by_the_sweep(vendor, value):
    if connection.vendor != vendor:
        pytest.skip(f"a {vendor} value")
    poison = _poison(value, "available_at")
    assert quarantine_unreachable() == 1
    assert quarantine_unreachable() == 0  # once
    failed = _drain_and_check(poison, "quarantined", "available_at", "can never be reached")
    assert failed.attempts == 0


# SQLite stores whatever bytes it is given as TEXT, and its JSON check passes a string that
# is not UTF-8: (column, SQL value) of such rows. (PostgreSQL and MariaDB refuse them.)
NOT_UTF8 = [("name", "CAST(X'74657374735c80' AS TEXT)"),
            ("payload", "CAST(X'7b2261726773223a5b2280225d2c226b7761726773223a7b7d7d' AS TEXT)"),
            ("last_error", "CAST(X'80' AS TEXT)")]


@pytest.mark.parametrize(("column", "value"), NOT_UTF8)
def test_text_that_is_not_utf8_on_sqlite_is_quarantined(column, value):
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite stores text that is not UTF-8")
    poison = _poison(value, column)
    _drain_and_check(poison, "quarantined", column, "is not UTF-8 text")


def test_housekeeping_sweeps_for_rows_that_can_never_become_due_once_an_hour(monkeypatch):
    from django_jobguard.operations import maintenance

    if connection.vendor == "mysql":
        pytest.skip("MySQL stores no date past what Python loads")
    monkeypatch.setattr(maintenance, "_quarantined_at", [])
    _poison(dict(NEVER_DUE)[connection.vendor], "available_at")
    assert maintenance.housekeeping().quarantined == 1
    _poison(dict(NEVER_DUE)[connection.vendor], "available_at")
    assert maintenance.housekeeping().quarantined == 0  # not again within the hour
    monkeypatch.setattr(maintenance, "QUARANTINE_EVERY", 0.0)
    assert maintenance.housekeeping().quarantined == 1
    assert FailedJob.objects.count() == 2 and not QueuedJob.objects.exists()
