"""A real browser (headless Chromium through Playwright) logs into the admin of a running test
server, opens the locks page and force-releases a lock.

``.ci/run`` installs Debian's ``chromium``; Playwright drives it (no ``playwright install``).
``JOBGUARD_DOCS_SCREENSHOTS=docs/img`` also writes the screenshots used in the docs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections

from django_jobguard import get_store
from tests.support.operate import UniqueReport, reserved

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-extensions", "--no-first-run",
        "--disable-sync", "--disable-default-apps", "--mute-audio"]

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser(monkeypatch):
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are
    # still plain sequential code, which Django allows with this switch.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS,
                                              headless=True)
        yield chromium
        chromium.close()
        # ORM calls made while Playwright's loop runs get their own connections (Django keys
        # them by async context); close them here, or the test database cannot be dropped.
        connections.close_all()


def test_force_release_a_lock_from_the_admin(live_server, browser, store_alias, tmp_path):
    from playwright.sync_api import expect

    User.objects.create_superuser("admin", password="jobguard-pw")
    store = get_store()
    key = "jobguard:overlap:demo.jobs.ChargeInvoice:42"
    running = reserved(name="demo.jobs.ChargeInvoice", worker_id="web-1:4242:5f3a")
    store.acquire(key, "5f3a-owner", ttl=600, job_id=str(running.id))
    UniqueReport(7).dispatch()  # a unique lock whose job waits in the queue
    store.acquire("jobguard:unique:demo.jobs.SyncProfile:3", "gone",
                  job_id="6d1c6c4e-0000-4000-8000-000000000003")  # its job is gone: stale

    page = browser.new_page(viewport={"width": 1280, "height": 640})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/django_jobguard/lock/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "jobguard-pw")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/django_jobguard/lock/**")

    row = page.locator(f'tr[data-key="{key}"]')
    expect(row).to_contain_text("overlap")
    expect(row).to_contain_text("5f3a-owner")
    stale = page.locator('tr[data-key="jobguard:unique:demo.jobs.SyncProfile:3"]')
    expect(stale.locator(".jobguard-stale")).to_have_text("stale")
    _screenshot(page, tmp_path / "locks-before.png", docs_name="admin-locks.png")

    row.get_by_role("button", name="Force release").click()
    # Its job runs on a live worker: a confirmation first.
    expect(page.locator("#jobguard-confirm-question")).to_contain_text(
        f"Are you sure you want to force-release lock {key}?")
    assert store.get_lock(key) is not None
    page.get_by_role("button", name="Yes, force-release it").click()
    expect(page.locator(".messagelist")).to_contain_text(f"Released lock {key}.")
    expect(page.locator(f'tr[data-key="{key}"]')).to_have_count(0)
    after = tmp_path / "locks-after.png"
    _screenshot(page, after)
    assert store.get_lock(key) is None
    assert store.get_lock("jobguard:unique:tests.operate.UniqueReport:7") is not None
    assert after.stat().st_size > 10_000  # a rendered page, not a blank image

    page.goto(f"{live_server.url}/admin/django_jobguard/queuedjob/")
    expect(page.locator("#result_list")).to_contain_text("reserved by web-1:4242:5f3a")
    _screenshot(page, tmp_path / "queued.png", docs_name="admin-queued-jobs.png")


def _screenshot(page, path: Path, *, docs_name: str = "") -> None:
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("JOBGUARD_DOCS_SCREENSHOTS")
    if docs_name and target and get_store().alias == "database":
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / docs_name), full_page=True)


def test_the_failed_jobs_retry_button_looks_like_the_history_link_beside_it(
        live_server, monkeypatch):
    """Issue 30 item 8: the Retry button was an unstyled <button> among the object tools."""
    from django_jobguard.models import FailedJob
    from tests.support.browser import chromium, log_in
    from tests.support.operate import failed_job

    job = failed_job()
    path = f"/admin/django_jobguard/failedjob/{job.id}/change/"
    with chromium(monkeypatch) as browser:
        page = log_in(browser, live_server, path)
        style = ("e => { const s = getComputedStyle(e); return [s.backgroundColor, s.color, "
                 "s.textTransform, s.fontSize, s.borderRadius, s.borderTopWidth]; }")
        button = page.eval_on_selector("#jobguard-retry button", style)
        history = page.eval_on_selector(".object-tools a.historylink", style)
        assert button == history, (button, history)
        page.click("#jobguard-retry button")
        page.wait_for_url("**/failedjob/")
    assert not FailedJob.objects.filter(id=job.id).exists()
