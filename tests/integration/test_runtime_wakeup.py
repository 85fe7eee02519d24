"""LISTEN wake-ups on PostgreSQL never stop without a word."""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy import Engine

import outbox
from relay.runtime.wakeup import Listener, listener_for
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _enqueue(engine: Engine) -> bool:
    """Enqueue one message (its commit notifies); False, so a wait goes on to its condition."""
    with engine.begin() as conn:
        outbox.enqueue(conn, exchange="ex", routing_key="rk", payload={})
    return False


def test_a_failing_wake_up_is_logged_and_the_next_one_still_arrives(
    pg_url: str, pg_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []
    woke = threading.Event()

    def on_notify() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the loop's queue is gone")
        woke.set()

    listener = listener_for(pg_url, on_notify)
    assert isinstance(listener, Listener)
    listener.start()
    try:
        # Listening once the first failure count is zero and the connection is up.
        wait_until(lambda: listener.alive, what="the listener thread")
        with caplog.at_level(logging.WARNING, logger="relay.wakeup"):
            wait_until(lambda: _enqueue(pg_engine) or calls, timeout=15, what="a first wake-up")
            # Keep notifying: the listener reconnects after its backoff and wakes again.
            wait_until(
                lambda: _enqueue(pg_engine) or woke.wait(0.2), timeout=20, what="a second wake-up"
            )
        assert listener.alive
        lost = [r for r in caplog.records if r.getMessage() == "listen.lost"]
        assert lost
        assert "RuntimeError" in str(getattr(lost[0], "error", ""))
    finally:
        listener.stop()
