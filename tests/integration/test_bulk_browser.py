"""Search and bulk actions in a real browser (headless Chromium through Playwright): search
failed jobs by an argument, select all that match (more than a page), confirm the count and
retry them; the queued jobs and workers lists at 1280 px with a worker that is gone."""

from __future__ import annotations

import pytest

from django_jobguard.models import FailedJob, QueuedJob, Worker
from tests.support.browser import chromium, log_in, screenshot
from tests.support.operate import reserved, waiting

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser(monkeypatch):
    with chromium(monkeypatch) as launched:
        yield launched


def failed(invoice_id: int, n: int) -> FailedJob:
    return FailedJob.objects.create(
        name="billing.jobs.ChargeInvoice", queue="billing", attempts=3,
        payload={"args": [], "kwargs": {"invoice_id": invoice_id, "attempt_no": n}},
        exception_class="requests.exceptions.Timeout",
        message=f"POST /charges timed out after 30 s (invoice {invoice_id})",
        reason="its last try (3 of 3) raised")


def fits(page) -> bool:
    """No horizontal scrolling: neither the page nor the list's table (Django's changelist
    scrolls a table that is too wide inside its own box)."""
    return page.evaluate("""() => {
        const results = document.querySelector('.results');
        return document.documentElement.scrollWidth <= window.innerWidth
            && (!results || results.scrollWidth <= results.clientWidth);
    }""")


def viewport_shot(page, path, docs_name: str) -> None:
    """The visible 1280 x 720 only (a list of 50 rows would be a very tall image)."""
    import os
    from pathlib import Path

    page.screenshot(path=str(path))
    target = os.environ.get("JOBGUARD_DOCS_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / docs_name))


def test_search_select_all_confirm_and_retry(live_server, browser, tmp_path):
    from playwright.sync_api import expect

    for n in range(60):
        failed(7, n)  # more than one page (50)
    for n in range(4):
        failed(8, n)
    page = log_in(browser, live_server, "/admin/django_jobguard/failedjob/")
    assert fits(page)
    page.fill("#searchbar", "kwargs__invoice_id=7")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=kwargs__invoice_id**")
    expect(page.locator(".paginator")).to_contain_text("60 failed jobs")
    assert fits(page)
    viewport_shot(page, tmp_path / "search.png", "admin-failed-search.png")

    page.check("#action-toggle")  # the page's rows, then "Select all 60"
    page.click(".actions .question a")
    expect(page.locator(".actions .all")).to_be_visible()
    page.select_option("select[name=action]", "retry")
    page.click("button[name=index]")
    expect(page.locator("#jobguard-confirm-question")).to_have_text(
        "Are you sure you want to retry 60 failed jobs? They are queued again with fresh "
        "attempts.")
    expect(page.locator("#jobguard-confirm-search")).to_contain_text("kwargs__invoice_id=7")
    assert FailedJob.objects.count() == 64 and not QueuedJob.objects.exists()
    screenshot(page, tmp_path / "confirm.png", docs_name="admin-bulk-retry-confirm.png")

    page.get_by_role("button", name="Yes, retry them").click()
    expect(page.locator(".messagelist")).to_contain_text("60 jobs are queued again.")
    assert QueuedJob.objects.count() == 60
    assert set(FailedJob.objects.values_list("payload__kwargs__invoice_id", flat=True)) == {8}


def test_queued_list_fits_at_1280_with_a_stale_reservation(live_server, browser, tmp_path):
    from playwright.sync_api import expect

    gone = reserved(name="billing.jobs.ChargeInvoice", queue_name="billing",
                    worker_id="web-2:31337:9c1e")
    Worker.objects.filter(id="web-2:31337:9c1e").update(last_seen_at="2000-01-01T00:00:00Z")
    reserved(name="reports.jobs.ExportReport", queue_name="reports",
             worker_id="web-1:4242:5f3a")
    for name in ("emails.jobs.SendWelcome", "search.jobs.Reindex"):
        waiting(name=name)
    page = log_in(browser, live_server, "/admin/django_jobguard/queuedjob/")
    expect(page.locator("#result_list")).to_contain_text(
        "stale: worker web-2:31337:9c1e is gone")
    assert fits(page)
    screenshot(page, tmp_path / "queued.png", docs_name="admin-queued-stale.png")

    page.locator(f'input[name=_selected_action][value="{gone.id}"]').check()
    page.select_option("select[name=action]", "requeue")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("1 job is queued again.")
    assert QueuedJob.objects.with_state().get(id=gone.id).state == "waiting"

    page.goto(f"{live_server.url}/admin/django_jobguard/worker/")
    expect(page.locator("#result_list")).to_contain_text("gone: no heartbeat for RETRY_AFTER")
    assert fits(page)
    screenshot(page, tmp_path / "workers.png", docs_name="admin-workers.png")
