"""The browser tier: the console driven in a real Chromium (Debian's, through Playwright; no
browser download), one browser per module, a fresh context per test. Screenshots of every page a
test visits are written to tests/artifacts/console/ (git-ignored) for a person to look at."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from relay.console.server import ConsoleServer, open_console

CHROMIUM = Path("/usr/bin/chromium")
# Headless as root needs --no-sandbox; the rest keep Chromium from phoning home meanwhile.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
TOKEN = "browser-test-console-token-42"
TRACE_URL = "http://localhost:16686/trace/{trace_id}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: scripts/ensure-services.sh installs it "
            "(Debian's chromium package)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(20_000)
    yield opened
    context.close()


@pytest.fixture
def console(pg_url: str, pg_engine: object) -> Iterator[ConsoleServer]:
    server = open_console(pg_url, host="127.0.0.1", port=0, token=TOKEN, trace_url=TRACE_URL)
    server.start()
    yield server
    server.stop()


def shot(page: Page, name: str) -> Path:
    """A full-page screenshot kept as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{re.sub(r'[^a-z0-9-]+', '-', name.lower())}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page: Page, console: ConsoleServer, token: str = TOKEN, name: str = "alice") -> None:
    page.goto(console.url + "login")
    page.fill("input[name=name]", name)
    page.fill("input[name=token]", token)
    page.click("form.login button")
    page.wait_for_load_state()
