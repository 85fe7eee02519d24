"""LISTEN wake-ups on PostgreSQL never stop without a word."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid

import pytest
from sqlalchemy import Engine

import outbox
from relay.runtime.wakeup import Listener, listener_for
from tests.support.db import PG_ADMIN_URL, make_app_engine
from tests.support.templates import Templates
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _enqueue(engine: Engine, *, idempotency: bool = False) -> bool:
    """Enqueue one message (its commit notifies); False, so a wait goes on to its condition.
    With an idempotency key it takes the Core path, whose notification names no table."""
    key = str(uuid.uuid4()) if idempotency else None
    with engine.begin() as conn:
        outbox.enqueue(conn, exchange="ex", routing_key="rk", payload={}, idempotency_key=key)
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


def _everyone_woken(engine: Engine, event: threading.Event) -> bool:
    return _enqueue(engine, idempotency=True) or event.wait(0.2)


def test_a_schema_s_enqueue_wakes_its_own_relay_and_not_another_schema_s(
    pg_admin: Engine, templates: Templates
) -> None:
    """Schema-per-tenant: every tenant's relay LISTENs on the database's one channel; the common
    path's notification names the table written, so only its own relay claims. A notification
    without a table (the Core path, with an idempotency key) wakes every one."""
    schemas = [f"t_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    engines, listeners, woken = [], [], []
    try:
        for schema in schemas:
            with pg_admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
            engine = make_app_engine(f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}")
            templates.migrate(engine)
            engines.append(engine)
            event = threading.Event()
            listener = listener_for(engine.url.render_as_string(False), event.set)
            assert listener is not None
            listener.start()
            listeners.append(listener)
            woken.append(event)
        for event in woken:  # listening once a notification for everyone arrives
            wait_until(functools.partial(_everyone_woken, engines[0], event))
        time.sleep(1.0)  # the last of those notifications delivered
        for event in woken:
            event.clear()
        _enqueue(engines[1])
        assert woken[1].wait(10)
        assert not woken[0].wait(1.0)
        _enqueue(engines[0])
        assert woken[0].wait(10)
    finally:
        for listener in listeners:
            listener.stop()
        for engine, schema in zip(engines, schemas, strict=False):
            engine.dispose()
            with pg_admin.connect() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
