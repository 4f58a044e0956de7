"""The operator console at 1280 px in a real browser (headless Chromium through Playwright):
every admin list and the locks page fit the window (docs/operate.md promises it), a failed
batch's progress bar does not look like a completed one, and the live pages refresh
themselves (with a pause toggle). ``JOBGUARD_DOCS_SCREENSHOTS=docs/img`` writes the
screenshots docs/operate.md shows."""

from __future__ import annotations

import datetime
import uuid

import pytest
from django.test import override_settings
from django.utils import timezone

from django_jobguard import get_store, history
from django_jobguard.models import (
    Batch,
    Chain,
    FailedJob,
    FinishedRun,
    JobResult,
    PausedQueue,
    QueueAlert,
    QueuedJob,
    ScheduleTick,
    Throttle,
    Worker,
)
from tests.support.browser import chromium, log_in, screenshot
from tests.support.operate import reserved, waiting

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1280
#: Every admin list of jobguard and the store pages, as an operator opens them.
PAGES = ["dashboard", "queuedjob", "failedjob", "lock", "throttle", "worker", "pausedqueue",
         "jobresult", "scheduletick", "chain", "batch", "finishedrun"]
LONG_NAME = "billing.integrations.payment_gateway.jobs.ReconcileSettlementReport"


@pytest.fixture
def browser(monkeypatch):
    with chromium(monkeypatch) as launched:
        yield launched


def _scene() -> None:
    """Rows with long names, keys, arguments and messages in every list."""
    now = timezone.now()
    args = {"args": [918273, "acct_1NvX8q2eZvKYlo2C"],
            "kwargs": {"settlement_date": "2026-12-05", "currency": "EUR", "notify": True}}
    QueuedJob.objects.bulk_create([
        QueuedJob(name=LONG_NAME, queue="billing-reconciliation", payload=args,
                  available_at=now - datetime.timedelta(minutes=3)),
        QueuedJob(name=LONG_NAME, queue="billing-reconciliation", payload=args,
                  available_at=now + datetime.timedelta(hours=2)),
        QueuedJob(name="emails.jobs.SendWelcome", queue="emails", payload=args,
                  cancel_requested_at=now),
    ])
    gone = reserved(name=LONG_NAME, queue_name="billing-reconciliation",
                    worker_id="worker-pod-7f9c8d6b5-x2k4q:31337:9c1e4f")
    QueuedJob.objects.filter(pk=gone.pk).update(progress=0.42,
                                                progress_message="page 42 of 100")
    Worker.objects.filter(id="worker-pod-7f9c8d6b5-x2k4q:31337:9c1e4f").update(
        last_seen_at="2000-01-01T00:00:00Z", current_job=str(gone.id))
    Worker.objects.create(id="worker-pod-7f9c8d6b5-h8m2z:4242:5f3a9b", hostname="worker-pod-"
                          "7f9c8d6b5-h8m2z", pid=4242, queues="billing-reconciliation,emails,"
                          "reports,default", current_job=str(uuid.uuid4()), jobs_processed=123456)
    FailedJob.objects.create(
        name=LONG_NAME, queue="billing-reconciliation", payload=args, attempts=5,
        exception_class="requests.exceptions.ConnectionError",
        message="HTTPSConnectionPool(host='api.payment-gateway.example.com', port=443): Max "
                "retries exceeded with url: /v1/settlements/2026-12-05?expand=transactions",
        reason="its last try (5 of 5) raised")
    store = get_store()
    for n in range(3):
        store.acquire(f"jobguard:overlap:{LONG_NAME}:settlement:acct_1NvX8q2eZvKYlo2C:{n}",
                      f"{uuid.uuid4()}", ttl=600, job_id=str(gone.id))
    store.acquire(f"jobguard:unique:{LONG_NAME}:2026-12-05:EUR", f"{uuid.uuid4()}",
                  job_id=str(uuid.uuid4()))  # its job is gone: stale
    Throttle.objects.create(key=f"jobguard:rate:payment-gateway:{LONG_NAME}:acct_1NvX8q2eZvKY",
                            kind="rate", hits=3, limit=5,
                            resets_at=now + datetime.timedelta(seconds=40),
                            expires_at=now + datetime.timedelta(seconds=40))
    PausedQueue.objects.create(queue="billing-reconciliation-backfill", paused_by="operator")
    JobResult.objects.create(id=uuid.uuid4(), name=LONG_NAME, queue="billing-reconciliation",
                             status="SUCCESSFUL", finished_at=now, return_value={"rows": 12})
    ScheduleTick.objects.create(schedule="nightly-settlement-reconciliation-eur",
                                tick=now.replace(second=0, microsecond=0),
                                job_id=str(uuid.uuid4()))
    Chain.objects.create(name="onboarding-flow-for-enterprise-customers", links=[
        {"job": LONG_NAME, "status": "done"}, {"job": LONG_NAME, "status": "queued"}])
    for name, total, pending, failed, finished in (
            ("nightly-settlement-import-2026-12-05", 250, 0, 0, now),
            ("nightly-settlement-import-2026-12-04", 250, 37, 37, now),
            ("nightly-settlement-import-2026-12-06", 250, 120, 0, None)):
        Batch.objects.create(name=name, total_jobs=total, pending_jobs=pending,
                             failed_jobs=failed, finished_at=finished,
                             failed_job_ids=[str(uuid.uuid4())] if failed else [])
    FinishedRun.objects.bulk_create([FinishedRun(
        job_id=uuid.uuid4(), state=state, name=LONG_NAME, queue="billing-reconciliation",
        arguments=args, attempt=1, worker="worker-pod-7f9c8d6b5-h8m2z:4242:5f3a9b",
        started_at=now, finished_at=now, runtime=12.5, wait=0.8,
        error="ConnectionError: Max retries exceeded" if state == "FAILED" else "")
        for state in ("DONE", "FAILED")])
    history.add_counts({"billing-reconciliation": (40, 3), "emails": (12, 0)})
    QueueAlert.objects.create(queue="billing-reconciliation", slo="max_wait", breached=True,
                              value=180, threshold=60, changed_at=now)


def _width(page) -> dict:
    return page.evaluate("""() => {
        const results = document.querySelector('.results');
        return {page: document.documentElement.scrollWidth,
                results: results ? results.scrollWidth - results.clientWidth : 0};
    }""")


def test_every_admin_list_and_the_locks_page_fit_1280_px(live_server, browser, tmp_path):
    _scene()
    page = log_in(browser, live_server, "/admin/django_jobguard/", width=WIDTH)
    widths = {}
    for name in PAGES:
        page.goto(f"{live_server.url}/admin/django_jobguard/{name}/")
        page.wait_for_selector("#content")
        widths[name] = _width(page)
        if name == "lock":
            # The Force-release buttons are on screen, not off to the right.
            boxes = page.locator("input[value='Force release']").evaluate_all(
                "els => els.map(e => e.getBoundingClientRect().right)")
            assert boxes
            widths["lock buttons"] = {"page": max(boxes), "results": 0}
            screenshot(page, tmp_path / "locks.png", docs_name="admin-locks-1280.png")
        if name == "batch":
            screenshot(page, tmp_path / "batches.png", docs_name="admin-batches.png")
    # The page (document scrollWidth) and each list's own box (Django scrolls a table that is
    # too wide inside it) need no horizontal scrolling.
    assert {n: w for n, w in widths.items() if w["page"] > WIDTH or w["results"] > 0} == {}


# -- live pages ------------------------------------------------------------------------------


def _rows(page) -> int:
    return page.locator("#result_list tbody tr").count()


def _polled(page) -> None:
    """The page's first poll is done: it knows the version of what it shows."""
    from playwright.sync_api import expect

    expect(page.locator("#jobguard-live .jobguard-live-status")).to_contain_text("Updated")


@override_settings(JOBGUARD={"ADMIN_REFRESH_SECONDS": 1, "QUEUES": {"emails": {"max_wait": 60}}})
def test_the_dashboard_refreshes_itself_and_its_toggle_pauses_it(live_server, browser, tmp_path):
    from playwright.sync_api import expect

    waiting(name="emails.jobs.SendWelcome", queue_name="emails")
    page = log_in(browser, live_server, "/admin/django_jobguard/dashboard/", width=WIDTH)
    live = page.locator("#jobguard-live")
    expect(live).to_have_attribute("data-state", "live")
    # A queue appears and another breaches its objective while the page is open.
    waiting(name="reports.jobs.ExportReport", queue_name="reports")
    QueueAlert.objects.create(queue="emails", slo="max_wait", breached=True, value=75,
                              threshold=60, changed_at=timezone.now())
    expect(page.locator('#jobguard-queues tr[data-queue="reports"]')).to_be_visible()
    expect(page.locator("#jobguard-breached")).to_contain_text("emails")
    expect(live.locator(".jobguard-live-status")).to_contain_text("Updated")
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    screenshot(page, tmp_path / "dashboard-live.png", docs_name="dashboard-live.png")

    toggle = live.get_by_role("button", name="Pause live updates")
    toggle.click()
    expect(live).to_have_attribute("data-state", "paused")
    expect(live.locator(".jobguard-live-status")).to_have_text("Live updates paused.")
    refreshes = live.get_attribute("data-refreshes")
    waiting(name="search.jobs.Reindex", queue_name="search")
    page.wait_for_timeout(3000)  # three intervals: a live page would have refreshed
    expect(page.locator('#jobguard-queues tr[data-queue="search"]')).to_have_count(0)
    assert live.get_attribute("data-refreshes") == refreshes
    page.reload()  # the choice is kept in this browser
    expect(page.locator("#jobguard-live")).to_have_attribute("data-state", "paused")
    page.get_by_role("button", name="Resume live updates").click()
    expect(page.locator("#jobguard-live")).to_have_attribute("data-state", "live")
    expect(page.locator('#jobguard-queues tr[data-queue="search"]')).to_be_visible()


@override_settings(JOBGUARD={"ADMIN_REFRESH_SECONDS": 1})
def test_a_job_list_refreshes_when_jobs_arrive_but_not_under_a_selection(
        live_server, browser, tmp_path):
    from playwright.sync_api import expect

    waiting(name="emails.jobs.SendWelcome", queue_name="emails")
    page = log_in(browser, live_server, "/admin/django_jobguard/queuedjob/", width=WIDTH)
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    _polled(page)
    waiting(name="reports.jobs.ExportReport", queue_name="reports")
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    expect(page.locator(".paginator")).to_contain_text("2 queued jobs")
    # Rows selected for an action: the list waits.
    page.locator("#result_list tbody tr input.action-select").first.check()
    waiting(name="search.jobs.Reindex", queue_name="search")
    page.wait_for_timeout(3000)
    assert _rows(page) == 2
    page.locator("#result_list tbody tr input.action-select").first.uncheck()
    expect(page.locator("#result_list tbody tr")).to_have_count(3)
    # Django's actions work on the refreshed rows: the counter follows a selection.
    page.locator("#result_list tbody tr input.action-select").nth(1).check()
    expect(page.locator(".action-counter")).to_contain_text("1 of 3 selected")
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    screenshot(page, tmp_path / "queued-live.png", docs_name="admin-live-queued.png")
    # Deleting a job elsewhere shows too (after the selection is cleared).
    page.locator("#result_list tbody tr input.action-select").nth(1).uncheck()
    QueuedJob.objects.filter(queue="search").delete()
    expect(page.locator("#result_list tbody tr")).to_have_count(2)


@override_settings(JOBGUARD={"ADMIN_REFRESH_SECONDS": 1})
def test_the_locks_page_refreshes_when_a_lock_is_taken(live_server, browser):
    from playwright.sync_api import expect

    store = get_store()
    store.acquire("jobguard:unique:emails.jobs.SendWelcome:1", "owner-1", ttl=600)
    page = log_in(browser, live_server, "/admin/django_jobguard/lock/", width=WIDTH)
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    _polled(page)
    store.acquire("jobguard:unique:emails.jobs.SendWelcome:2", "owner-2", ttl=600)
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
