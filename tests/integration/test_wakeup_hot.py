"""An idle relay is woken by each commit, not by its next poll; the NOTIFY costs no round trip.

The relay tests run in a database of their own: notifications are per database, and another
test's enqueue on the shared one would wake the relay too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

import outbox
from outbox import pg_insert
from outbox.prepared import prepare
from relay.loop.relay import Relay
from relay.runtime.wakeup import Listener, listener_for
from relay.store.sql_store import open_store
from tests.support.broker import Broker
from tests.support.db import PG_ADMIN_URL
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

POLL = 30.0  # seconds: far longer than any wait below, so only a wake-up can deliver in time


@pytest.fixture
def own_db(pg_admin: Engine) -> Iterator[str]:
    """A database of this test's own (a URL on it), dropped at the end."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        outbox.create_schema(engine)
    finally:
        engine.dispose()
    yield url
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def restore_ration() -> Iterator[None]:
    before = outbox.configure()
    yield
    outbox.configure(
        notify=before.notify, notify_rate=before.notify_rate, notify_burst=before.notify_burst
    )


def _idle(relay: Relay) -> bool:
    """Whether the relay's next claim is a long poll away (it is waiting, nothing to do)."""
    now = time.monotonic()
    return relay.claimer.next_turn(now) > now + POLL / 2


def _listening(relay: Relay, url: str) -> Listener:
    listener = listener_for(url, relay.wake)
    assert isinstance(listener, Listener)
    listener.start()
    wait_until(lambda: listener.carried, timeout=20, what="the relay to LISTEN")
    return listener


def test_each_commit_wakes_an_idle_relay_at_once(
    own_db: str, relay_factory: RelayFactory, broker: Broker, restore_ration: None
) -> None:
    outbox.configure(notify=True)
    relay = relay_factory(own_db, poll_interval=POLL, min_poll_interval=POLL)
    listener = _listening(relay, own_db)
    engine = create_engine(own_db)
    try:
        # One after another, each while the relay sits idle: a ration by time slot (one NOTIFY
        # per 100 ms) would leave every message after the first to the 30 s poll.
        for n in range(4):
            wait_until(lambda: _idle(relay), timeout=20, what="the relay to be idle")
            with engine.begin() as conn:
                sent = outbox.enqueue(
                    conn, exchange=broker.exchange, routing_key="hot", payload={"n": n}
                )
            broker.collect_ids([sent], timeout=POLL / 3)
    finally:
        listener.stop()
        engine.dispose()


def _statements(engine: Engine) -> list[str]:
    """Every statement `engine` sends from now on."""
    sent: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(*args: Any) -> None:
        sent.append(str(args[2]))

    return sent


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_the_notify_rides_on_the_insert_and_is_rationed(
    pg_url: str, pg_engine: Engine, driver: str, restore_ration: None
) -> None:
    engine = create_engine(make_url(pg_url).set(drivername=f"postgresql+{driver}"))
    sent = _statements(engine)
    # A fresh bucket of two, refilling about never: two commits notify, the third does not.
    outbox.configure(notify=True, notify_rate=1e-6, notify_burst=2)
    try:
        with engine.connect() as conn:
            for n in range(3):
                with conn.begin():
                    outbox.enqueue(conn, exchange="ex", routing_key="rk", payload={"n": n})
    finally:
        engine.dispose()
    ours = [s for s in sent if "outbox_message" in s or "pg_notify" in s]
    inserts = [s for s in ours if s.lstrip().upper().startswith("INSERT")]
    assert len(inserts) == len(ours) == 3  # no statement of its own for the NOTIFY
    assert ["pg_notify" in s for s in inserts] == [True, True, False]
    with pg_engine.connect() as conn:
        stored = conn.exec_driver_sql(
            "SELECT headers::text, created_at = available_at FROM outbox_message"
        ).all()
    assert stored == [("null", True)] * 3  # as Core's path writes them


def test_a_schema_translate_map_takes_cores_path(pg_engine: Engine) -> None:
    message = prepare(
        exchange="ex",
        routing_key="rk",
        payload={},
        key=None,
        headers=None,
        idempotency_key=None,
        delay=None,
        priority=0,
        max_attempts=None,
        content_type=None,
    )
    with pg_engine.connect() as conn:
        assert pg_insert.covers(conn, message)
        mapped = conn.execution_options(schema_translate_map={None: None})
        assert not pg_insert.covers(mapped, message)


def test_the_relays_own_commits_wait_for_no_disk_and_others_do(pg_url: str) -> None:
    relaxed = open_store(pg_url, relaxed_commit=True)
    plain = open_store(pg_url)
    try:
        for store, expected in ((relaxed, "off"), (plain, "on")):
            with store.engine.connect() as conn:
                settings = [
                    conn.exec_driver_sql(f"SHOW {name}").scalar()
                    for name in ("synchronous_commit", "jit", "enable_seqscan", "enable_bitmapscan")
                ]
            # The loop's own connections also plan no JIT, no sequential and no bitmap scan.
            assert settings == [expected] * 4
    finally:
        relaxed.close()
        plain.close()
