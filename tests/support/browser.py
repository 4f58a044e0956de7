"""A headless Chromium (Debian's ``/usr/bin/chromium``) through Playwright, for the admin's
browser tests, and screenshots that ``JOBGUARD_DOCS_SCREENSHOTS=docs/img`` also writes for
the docs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-extensions", "--no-first-run",
        "--disable-sync", "--disable-default-apps", "--mute-audio"]


@contextmanager
def chromium(monkeypatch) -> Iterator:
    """A launched browser; skips the test without Playwright or Chromium."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS,
                                             headless=True)
        try:
            yield browser
        finally:
            browser.close()
            connections.close_all()


def log_in(browser, live_server, next_path: str, *, user: User | None = None,
           width: int = 1280, height: int = 720):
    """A page logged into the admin (as a new superuser unless ``user``, password ``pw``),
    at ``next_path``."""
    if user is None:
        user = User.objects.create_superuser("admin", password="pw")
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(f"{live_server.url}/admin/login/?next={next_path}")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_path}**")
    return page


def screenshot(page, path: Path, *, docs_name: str = "") -> None:
    """Save a full-page screenshot at ``path`` (and as ``docs_name`` for the docs)."""
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("JOBGUARD_DOCS_SCREENSHOTS")
    if docs_name and target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / docs_name), full_page=True)
