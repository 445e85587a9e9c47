"""The browser tests' fixtures: the real platform (once for this package) and a headless Chromium.

Playwright drives the system's chromium (`/usr/bin/chromium`, Debian's package; `make test`
installs it where missing): never `playwright install`, which downloads a browser and fails offline.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, Playwright, sync_playwright

from allmende.testing.platform_harness import TRACE, Platform, running_platform

VIEWPORT = {"width": 1366, "height": 768}
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]


def chromium_path() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        raise RuntimeError(
            "no chromium: apt-get install -y --no-install-recommends chromium (never `playwright install`)"
        )
    return path


@pytest.fixture(scope="package")
def platform(
    kafka_bootstrap: str, chdb_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    if not TRACE.exists():
        pytest.skip(f"trace not found at {TRACE}")
    with running_platform(kafka_bootstrap, chdb_dsn, tmp_path_factory.mktemp("platform")) as running:
        yield running


# Package scope, not session: the sync API leaves an event loop running in the main thread until it
# stops, which would break every later test that calls asyncio.run.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@dataclass
class Visit:
    """A page opened on the dashboards, with what its console said."""

    page: Page
    status: int
    errors: list[str] = field(default_factory=list)

    def json(self, path: str, **params: Any) -> Any:
        """The JSON route, fetched with the page's session cookie (no bearer header)."""
        response = self.page.request.get(self.url(path), params=params or None)
        assert response.status == 200, f"{path}: {response.status} {response.text()}"
        return response.json()

    def url(self, path: str) -> str:
        return self.page.url.split("/ui", 1)[0] + path


def open_page(context: BrowserContext, url: str, wait_ready: bool = True) -> Visit:
    page = context.new_page()
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text} ({message.location.get('url', '')})")

    page.on("console", on_console)
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    response = page.goto(url)
    assert response is not None
    if wait_ready:
        page.wait_for_function("document.body.dataset.ready === 'true'", timeout=30_000)
    return Visit(page, response.status, errors)


@pytest.fixture
def signed_in(browser: Browser, platform: Platform) -> Iterator[Callable[[str], BrowserContext]]:
    """A fresh browser context signed in through the form with the given token."""
    contexts: list[BrowserContext] = []

    def sign_in(token: str) -> BrowserContext:
        context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
        contexts.append(context)
        page = context.new_page()
        page.goto(f"{platform.url}/ui/signin")
        page.fill("#token", token)
        with page.expect_navigation():
            page.click("button[type=submit]")
        assert "/ui/signin" not in page.url, page.content()
        page.close()
        return context

    yield sign_in
    for context in contexts:
        context.close()
