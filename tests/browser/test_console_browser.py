"""The console as an operator uses it, in a real Chromium, against PostgreSQL, RabbitMQ and a
running relay: find a dead message by filter, open it, replay it and see it published; reschedule
and reprioritize a pending one; a wrong token is refused."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, select

import outbox
from outbox.schema import attempt, message
from relay.console.server import ConsoleServer
from tests.browser.conftest import log_in, shot
from tests.support.broker import Broker
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def row(engine: Engine, message_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(message).where(message.c.id == message_id)).one()


def who_did(engine: Engine, message_id: uuid.UUID) -> list[tuple[str, str]]:
    stmt = (
        select(attempt.c.outcome, attempt.c.relay_id)
        .where(attempt.c.message_id == message_id, attempt.c.failure_class == "operator")
        .order_by(attempt.c.id)
    )
    with engine.connect() as conn:
        return [(str(o), str(r)) for o, r in conn.execute(stmt)]


def confirm(page: Page, summary: str) -> None:
    """The dialog says what will change; confirm it, and wait for the page to say it did."""
    expect(page.locator("#confirm-summary")).to_contain_text(summary)
    page.click("#confirm-go")
    expect(page.locator("#result")).not_to_be_empty()


def test_find_a_dead_message_by_filter_replay_it_and_see_it_published(
    page: Page, console: ConsoleServer, pg_url: str, pg_engine: Engine, broker: Broker,
    relay_factory: RelayFactory,
) -> None:  # fmt: skip
    unbound = broker.declare_exchange()  # no queue yet: its message is unroutable, dead at once
    other = broker.declare_exchange()
    with pg_engine.begin() as conn:
        lost = outbox.enqueue(conn, exchange=unbound, routing_key="order.created",
                              payload={"order": 42}, key="order-42")  # fmt: skip
        decoy = outbox.enqueue(conn, exchange=other, routing_key="x", payload={"n": 1})
    relay_factory(pg_url)
    wait_until(lambda: {row(pg_engine, i).state for i in (lost, decoy)} == {"dead"},
               timeout=20, what="both messages dead (unroutable)")  # fmt: skip
    broker.bind(broker.queue, unbound)  # the route exists now: a replay will be delivered

    log_in(page, console)
    console.console.monitor.refresh()
    page.goto(console.url)
    expect(page.locator("h1")).to_have_text("Overview")
    shot(page, "overview")

    page.goto(console.url + "messages")
    page.fill("input[name=state]", "dead")
    page.fill("input[name=exchange]", unbound)
    page.click("form.filters button")
    rows = page.locator("table#messages tr:has(td)")
    expect(rows).to_have_count(1)
    shot(page, "messages-dead-filtered")

    page.click(f"a:text('{lost}')")
    expect(page.locator("h1 .state")).to_have_text("dead")
    expect(page.locator("#payload")).to_contain_text('"order": 42')
    shot(page, "message-dead")

    page.click("form[data-action=replay] button")
    expect(page.locator("#confirm")).to_be_visible()
    shot(page, "confirm-replay")
    confirm(page, f"Replay message {lost}.")
    expect(page.locator("#result")).to_have_text(f"Replayed message {lost}.")
    # The page refreshes itself: the relay publishes the message, the page shows it.
    expect(page.locator("h1 .state")).to_have_text("published", timeout=30_000)
    shot(page, "message-published")
    broker.collect_ids([lost])
    assert row(pg_engine, decoy).state == "dead"
    assert who_did(pg_engine, lost) == [("replayed", "console:alice@127.0.0.1")]


def test_reschedule_and_reprioritize_a_pending_message(
    page: Page, console: ConsoleServer, pg_engine: Engine
) -> None:
    with pg_engine.begin() as conn:
        waiting = outbox.enqueue(conn, exchange="orders", routing_key="r", payload="later",
                                 delay=dt.timedelta(hours=1))  # fmt: skip
    log_in(page, console)
    page.goto(f"{console.url}messages/{waiting}")
    expect(page.locator("h1 .state")).to_have_text("pending")

    before = dt.datetime.now(dt.UTC)
    page.fill("form[data-action=reschedule] input[name=in]", "3h")
    page.click("form[data-action=reschedule] button")
    confirm(page, f"Reschedule message {waiting} to ")
    expect(page.locator("#result")).to_contain_text(f"Rescheduled message {waiting} to ")
    due = row(pg_engine, waiting).available_at
    assert dt.timedelta(hours=3) <= due - before < dt.timedelta(hours=3, minutes=5)

    page.fill("form[data-action=priority] input[name=priority]", "9")
    page.click("form[data-action=priority] button")
    confirm(page, f"Reprioritize message {waiting} to priority 9.")
    expect(page.locator("#result")).to_have_text(f"Reprioritized message {waiting} to priority 9.")
    assert row(pg_engine, waiting).priority == 9
    expect(page.locator("#attempts")).to_contain_text("prioritized")
    shot(page, "message-pending-changed")
    assert who_did(pg_engine, waiting) == [
        ("rescheduled", "console:alice@127.0.0.1"),
        ("prioritized", "console:alice@127.0.0.1"),
    ]


def test_a_wrong_token_is_refused(page: Page, console: ConsoleServer, pg_engine: Engine) -> None:
    with pg_engine.begin() as conn:
        pending = outbox.enqueue(conn, exchange="orders", routing_key="r", payload={"n": 1})
    log_in(page, console, token="not-the-console-token", name="mallory")
    expect(page.locator("main .problem")).to_have_text("wrong token")
    shot(page, "login-refused")
    assert not page.context.cookies()
    assert page.evaluate("() => localStorage.length") == 0
    # Reads need the token too: the page sends the browser to the login form.
    page.goto(f"{console.url}messages/{pending}")
    expect(page).to_have_url(f"{console.url}login")
    expect(page.locator("form[data-action]")).to_have_count(0)
    # Even a request made by hand from the page is refused, and nothing changes.
    status = page.evaluate(
        "async (url) => (await fetch(url, {method: 'POST'})).status",
        f"/api/messages/{pending}/cancel",
    )
    assert status == 401
    assert row(pg_engine, pending).state == "pending"
