"""The operate pages in a real browser (headless Chromium through Playwright): pausing and
resuming a queue."""

from __future__ import annotations

import pytest

from django_jobguard import queue
from tests.support.browser import chromium, log_in, screenshot
from tests.support.operate import waiting

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser(monkeypatch):
    with chromium(monkeypatch) as launched:
        yield launched


def test_pause_and_resume_a_queue_from_the_admin(live_server, browser, tmp_path):
    from playwright.sync_api import expect

    waiting(queue_name="emails")
    page = log_in(browser, live_server, "/admin/django_jobguard/pausedqueue/add/")
    page.fill("#id_queue", "emails")
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/django_jobguard/pausedqueue/")
    expect(page.locator("#result_list")).to_contain_text("emails")
    assert queue.paused() == {"emails"}
    screenshot(page, tmp_path / "paused.png", docs_name="admin-paused-queues.png")

    page.locator("input[name=_selected_action]").first.check()
    page.select_option("select[name=action]", "resume")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("1 queue resumed.")
    assert queue.paused() == set()
