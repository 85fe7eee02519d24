"""What a security review found the console's actions and credentials did, in a real Chromium: a
failure group's buttons act on exactly the messages its row counts (the default exchange, a NULL
error); a confirmation acts only on what its dry run counted; and what the browser keeps for the
console (cookies, a session) neither works from another program nor can be jammed by another
local page."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, update

import outbox
from outbox.schema import message
from relay.console.server import ConsoleServer
from tests.browser.conftest import log_in, shot
from tests.browser.test_console_browser import row

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def enqueue(engine: Engine, n: int, exchange: str) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange=exchange, routing_key="r", payload={"n": i})
            for i in range(n)
        ]


def kill(engine: Engine, ids: Sequence[uuid.UUID], error: str | None) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(message)
            .where(message.c.id.in_(list(ids)))
            .values(state="dead", last_error=error, last_failed_at=dt.datetime.now(dt.UTC))
        )


def states(engine: Engine, ids: Sequence[uuid.UUID]) -> list[str]:
    return [row(engine, i).state for i in ids]


def test_a_group_acts_on_exactly_the_messages_its_row_counts(
    page: Page, console: ConsoleServer, pg_engine: Engine
) -> None:
    shared = "NO_ROUTE shared error"
    default = enqueue(pg_engine, 2, "")  # the default exchange
    elsewhere = enqueue(pg_engine, 3, "billing")
    kill(pg_engine, default + elsewhere, shared)
    no_error = enqueue(pg_engine, 2, "orders")
    other_error = enqueue(pg_engine, 4, "orders")
    kill(pg_engine, no_error, None)
    kill(pg_engine, other_error, "rejected")

    log_in(page, console)
    page.goto(console.url + "messages?state=dead")
    target = page.locator("h2:text('Dead messages by error') + table tr:has(td)")
    expect(target).to_have_count(4)
    default_row = target.filter(has_text="(default)")
    expect(default_row.locator("td.num")).to_have_text("2")
    default_row.locator("form[data-action=discard] button").click()
    expect(page.locator("#confirm-summary")).to_contain_text("Discard 2 messages")
    page.click("#confirm-go")
    expect(page.locator("#result")).to_contain_text("Discarded 2 messages")
    assert states(pg_engine, default) == ["discarded"] * 2
    assert states(pg_engine, elsewhere) == ["dead"] * 3

    null_row = page.locator("h2:text('Dead messages by error') + table tr:has(td)").filter(
        has=page.locator("td.error:text-is('-')")
    )
    expect(null_row.locator("td.num")).to_have_text("2")
    null_row.locator("form[data-action=replay] button").click()
    expect(page.locator("#confirm-summary")).to_contain_text("Replay 2 messages")
    page.click("#confirm-go")
    expect(page.locator("#result")).to_contain_text("Replayed 2 messages")
    shot(page, "groups-acted-on")
    assert states(pg_engine, no_error) == ["pending"] * 2
    assert states(pg_engine, other_error) == ["dead"] * 4
    # The row's link lists what its buttons act on: the default exchange's two, no more.
    page.goto(console.url + "messages?state=dead")
    link = page.locator("h2:text('Dead messages by error') + table tr:has(td)").filter(
        has_text="billing"
    )
    expect(link.locator("td.num")).to_have_text("3")


def test_a_confirmation_acts_only_on_what_its_dry_run_counted(
    page: Page, console: ConsoleServer, pg_engine: Engine
) -> None:
    first = enqueue(pg_engine, 3, "orders")
    kill(pg_engine, first, "rejected")
    log_in(page, console)
    page.goto(console.url + "messages?state=dead&exchange=orders&created_since=10m")
    every_match = page.locator("div.actions:has-text('Every match') form[data-action=discard]")
    every_match.locator("button").click()
    expect(page.locator("#confirm-summary")).to_contain_text("Discard 3 messages")
    later = enqueue(pg_engine, 5, "orders")  # five more fail while the dialog is open
    kill(pg_engine, later, "rejected")
    page.click("#confirm-go")
    expect(page.locator("#result")).to_contain_text("Discarded 3 messages")
    expect(page.locator("#result")).to_contain_text("5 more match now and were left alone")
    assert states(pg_engine, first) == ["discarded"] * 3
    assert states(pg_engine, later) == ["dead"] * 5

    # One of the five the dialog counts is replayed meanwhile: the set changed, nothing does.
    every_match.locator("button").click()
    expect(page.locator("#confirm-summary")).to_contain_text("Discard 5 messages")
    with pg_engine.begin() as conn:
        conn.execute(update(message).where(message.c.id == later[0]).values(state="pending"))
    page.click("#confirm-go")
    expect(page.locator("#result")).to_contain_text("4 messages match now, 5 when counted")
    shot(page, "confirm-set-changed")
    assert states(pg_engine, later) == ["pending"] + ["dead"] * 4


def test_what_the_browser_keeps_neither_works_elsewhere_nor_can_be_jammed(
    page: Page, console: ConsoleServer, pg_engine: Engine
) -> None:
    victims = enqueue(pg_engine, 2, "orders")
    kill(pg_engine, victims, "rejected")
    log_in(page, console)
    page.goto(f"{console.url}messages/{victims[0]}")
    expect(page.locator("form[data-action=discard]")).to_have_count(1)

    # Every cookie the browser holds for 127.0.0.1 goes to any server on that host, whatever its
    # port: a program holding them (and what they fetch) can neither read nor act.
    jar = {c["name"]: c["value"] for c in page.context.cookies()}
    base = console.url.rstrip("/")
    with httpx.Client(base_url=base, cookies=jar, timeout=10) as thief:
        seen = thief.get(f"/messages/{victims[0]}")
        marker = '<meta name="csrf-token" content="'
        csrf = seen.text.split(marker, 1)[1].split('"', 1)[0] if marker in seen.text else ""
        stolen = thief.post(f"/api/messages/{victims[0]}/discard",
                            headers={"X-CSRF-Token": csrf})  # fmt: skip
        assert stolen.status_code in (401, 403), stolen.text
        assert thief.get("/api/messages").status_code == 401
    assert row(pg_engine, victims[0]).state == "dead"

    # A page on another port of this host plants cookies of the console's name: the operator
    # still acts.
    page.context.add_cookies(
        [{"name": "outbox_console", "value": "planted", "domain": "127.0.0.1", "path": p}
         for p in ("/", "/api")]
    )  # fmt: skip
    page.goto(f"{console.url}messages/{victims[1]}")
    page.click("form[data-action=discard] button")
    expect(page.locator("#confirm-summary")).to_contain_text(f"Discard message {victims[1]}.")
    page.click("#confirm-go")
    expect(page.locator("#result")).to_have_text(f"Discarded message {victims[1]}.")
    assert row(pg_engine, victims[1]).state == "discarded"

    # The page's own session, sent without the page's Origin, acts on nothing either.
    session = page.evaluate("() => localStorage.getItem('outbox-console-session')")
    with httpx.Client(base_url=base, timeout=10) as script:
        headless = script.post(f"/api/messages/{victims[0]}/discard",
                               headers={"X-Console-Session": str(session)})  # fmt: skip
        assert headless.status_code == 403, headless.text
    assert row(pg_engine, victims[0]).state == "dead"
