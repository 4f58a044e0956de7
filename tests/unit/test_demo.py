"""The examples in testproject/demo/jobs.py behave as docs/limits.md says."""

from __future__ import annotations

import logging

import pytest
from demo import jobs as demo
from demo.models import Profile

from django_jobguard import Limit
from django_jobguard.limits import window_key
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.stores import get_store
from tests.support import make_due, work

pytestmark = pytest.mark.django_db


def throttle(key: str):
    return next((t for t in get_store().throttles() if t.key == key), None)


def test_free_users_get_five_exports_an_hour_premium_users_are_unlimited(store_alias):
    for _ in range(7):
        demo.ExportPdf(1, "free").dispatch()
        demo.ExportPdf(2, "premium").dispatch()
    assert sorted(work()) == ["DONE"] * 12 + ["RELEASED"] * 2
    waiting = list(QueuedJob.objects.all())
    assert len(waiting) == 2 and all(row.attempts == 0 for row in waiting)
    assert {row.payload["args"][0] for row in waiting} == {1}
    assert throttle(window_key("exports", Limit.per_hour(5).by(1))).hits == 5
    assert throttle(window_key("exports", Limit.per_hour(5).by(2))) is None


def test_sms_outage_opens_the_circuit_and_a_bad_number_is_dropped(store_alias, released,
                                                                  caplog):
    Profile.objects.create(name="sms-gateway-down")
    demo.SendSms("12345", "hi").dispatch()  # not E.164: dropped, not failed, not counted
    assert work() == ["SKIPPED"]
    assert throttle("jobguard:circuit:sms-gateway") is None
    demo.SendSms("+15550001", "hi").dispatch()
    with caplog.at_level(logging.WARNING, logger="django_jobguard.limits"):
        for _ in range(10):
            assert work() == ["RELEASED"]
            make_due()
    assert len([r for r in caplog.records if "counted by" in r.getMessage()]) == 10
    assert [r["delay"] for r in released[:2]] == [30.0, 30.0]  # backoff between failures
    circuit = throttle("jobguard:circuit:sms-gateway")
    assert (circuit.state, circuit.hits) == ("open", 10)
    demo.SendSms("+15550002", "hello").dispatch()
    assert work() == ["RELEASED"] * 2  # both held while the circuit is open
    assert [r["reason"] for r in released[-2:]] == ["circuit_open"] * 2
    assert not FailedJob.objects.exists()


def test_generate_report_unique_then_circuit_then_rate_limit(store_alias, released):
    handles = [demo.GenerateReport(7, kind).dispatch()
               for kind in ("sales", "sales", "stock", "tax", "payroll")]
    assert [bool(h) for h in handles] == [True, False, True, True, True]  # unique per kind
    assert sorted(work()) == ["DONE"] * 3 + ["RELEASED"]
    assert [r["reason"] for r in released] == ["rate_limited"]
    assert QueuedJob.objects.get().attempts == 0
    assert throttle(window_key("reports", Limit.per_hour(100))).hits == 3  # all-or-nothing


def test_a_report_held_by_the_open_circuit_uses_no_rate_limit_slot(store_alias, released):
    store = get_store()
    for _ in range(5):
        store.circuit_leave("jobguard:circuit:report-renderer", owner="earlier",
                            outcome="failure", max_attempts=5, decay=300)
    demo.GenerateReport(8, "sales").dispatch()
    assert work() == ["RELEASED"]
    assert [r["reason"] for r in released] == ["circuit_open"]
    assert throttle(window_key("reports", Limit.per_minute(3).by(8))) is None
    assert throttle(window_key("reports", Limit.per_hour(100))) is None
