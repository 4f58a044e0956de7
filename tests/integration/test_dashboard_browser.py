"""The dashboard in a real browser (headless Chromium through Playwright): it loads with its
charts, and a queue is paused and resumed from it. ``JOBGUARD_DOCS_SCREENSHOTS=docs/img``
writes ``dashboard.png`` for docs/operate.md."""

from __future__ import annotations

import datetime
import math

import pytest
from django.utils import timezone

from django_jobguard import get_store, history, queue
from django_jobguard.models import QueuedJob, Worker
from tests.support.browser import chromium, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser(monkeypatch):
    with chromium(monkeypatch) as launched:
        yield launched


def _scene() -> None:
    """Three served queues with a day of history, one queue nobody serves, two workers."""
    now = timezone.now()
    rows = []
    for name, count, age in (("default", 120, 40), ("emails", 35, 200), ("reports", 4, 5),
                             ("imports", 12, 900)):
        rows += [QueuedJob(name="demo.jobs.SendWelcomeEmail", queue=name,
                           payload={"args": [], "kwargs": {}},
                           available_at=now - datetime.timedelta(seconds=age))
                 for _ in range(count)]
    rows += [QueuedJob(name="demo.jobs.SendWelcomeEmail", queue="emails",
                       payload={"args": [], "kwargs": {}},
                       available_at=now + datetime.timedelta(minutes=10)) for _ in range(6)]
    QueuedJob.objects.bulk_create(rows)
    current = history.current_minute()
    for back in range(24 * 60):
        wave = 1 + math.sin(back / 90)
        history.add_counts({
            "default": (int(40 + 25 * wave), 1 if back % 47 == 0 else 0),
            "emails": (int(12 + 8 * wave), 3 if 300 < back < 330 else 0),
            "reports": (1 if back % 6 == 0 else 0, 0),
        }, minute=current - datetime.timedelta(minutes=back))
    for n, queues in ((1, "default,emails"), (2, "default,reports")):
        Worker.objects.create(id=f"web-{n}:41{n}7:8c2e{n}", hostname=f"web-{n}", pid=4107 + n,
                              queues=queues, jobs_processed=1200 * n,
                              current_job="3f2b9c1e-5d7a-4e0b-9a61-0c8d2e7f4a10" if n == 1 else "")
    get_store().acquire("jobguard:overlap:demo.jobs.ChargeInvoice:42", "owner", ttl=600)


def test_dashboard_shows_charts_and_pauses_and_resumes_a_queue(live_server, browser, tmp_path):
    from playwright.sync_api import expect

    _scene()
    page = log_in(browser, live_server, "/admin/django_jobguard/dashboard/", width=1280,
                  height=900)
    expect(page.locator("#jobguard-queues tr[data-queue=default]")).to_contain_text("120")
    expect(page.locator("#jobguard-unserved")).to_contain_text("imports")
    expect(page.locator("svg.jobguard-chart")).to_have_count(8)  # 4 queues x (1 h, 24 h)
    points = page.locator(".jobguard-charts[data-queue=default] polyline.done").first
    assert len(points.get_attribute("points").split()) == 60
    expect(page.locator("#jobguard-workers")).to_contain_text("web-1:4117:8c2e1")
    store = page.locator(f'.jobguard-store[data-store="{get_store().alias}"]')
    expect(store.locator(".value")).to_have_text("1 / 0")  # one lock held, no open circuit
    # At 1280 px the page needs no horizontal scrolling.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    screenshot(page, tmp_path / "dashboard.png", docs_name="dashboard.png")

    row = page.locator("#jobguard-queues tr[data-queue=emails]")
    row.get_by_role("button", name="Pause").click()
    expect(page.locator(".messagelist")).to_contain_text("Paused queue emails")
    expect(row.locator(".jobguard-flag.paused")).to_have_text("paused")
    assert queue.paused() == {"emails"}
    row.get_by_role("button", name="Resume").click()
    expect(page.locator(".messagelist")).to_contain_text("Resumed queue emails")
    expect(row.get_by_role("button", name="Pause")).to_be_visible()
    assert queue.paused() == set()
    after = tmp_path / "after.png"
    screenshot(page, after)
    assert after.stat().st_size > 10_000  # a rendered page, not a blank image
