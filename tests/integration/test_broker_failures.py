"""What the broker refuses is never marked published: unroutable, nacked, missing exchange, and
rows that cannot be turned into a message."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

import outbox
from outbox.schema import attempt, message
from relay.core.policy import RetryPolicy
from tests.support.broker import Broker
from tests.support.db import states
from tests.support.relays import RelayFactory, drive, drive_until_settled

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

# Retries far enough away that a failed row stays where the test can look at it.
SLOW_RETRY = RetryPolicy(base=60.0, floor=60.0, cap=3600.0)


def row(engine: Engine, message_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(message).where(message.c.id == message_id)).one()


def aware(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; everything the project stores is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def history(engine: Engine, message_id: uuid.UUID) -> list[tuple[str, str]]:
    """(failure_class, outcome) of each recorded attempt of a message, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(attempt.c.failure_class, attempt.c.outcome)
            .where(attempt.c.message_id == message_id)
            .order_by(attempt.c.id)
        )
        return [(str(c), str(o)) for c, o in rows]


def test_unroutable_messages_are_not_marked_published(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    nowhere = broker.declare_exchange()  # exists, but no queue is bound to it
    with app_engine.begin() as conn:
        lost = outbox.enqueue(conn, exchange=nowhere, routing_key="order.created", payload={})
        routed = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="order.created", payload={}
        )
    relay = relay_factory(db_url, run=False)
    drive_until_settled(relay, 2)

    broker.collect_ids([routed])
    assert row(app_engine, routed).state == "published"
    failed = row(app_engine, lost)
    # Unroutable is a permanent failure by default: dead-lettered at once, with its reason.
    assert failed.state == "dead"
    assert failed.published_at is None
    assert "unroutable" in failed.last_error
    assert "NO_ROUTE" in failed.last_error
    assert nowhere in failed.last_error
    assert history(app_engine, lost) == [("unroutable", "dead")]


def test_unroutable_messages_go_back_to_pending_when_not_permanent(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    nowhere = broker.declare_exchange()
    with app_engine.begin() as conn:
        lost = outbox.enqueue(conn, exchange=nowhere, routing_key="order.created", payload={})
    policy = RetryPolicy(base=60.0, floor=60.0, cap=3600.0, permanent=frozenset())
    relay = relay_factory(db_url, run=False, policy=policy)
    started = dt.datetime.now(dt.UTC)
    drive_until_settled(relay, 1)

    failed = row(app_engine, lost)
    assert failed.state == "pending"
    assert failed.attempts == 1
    assert "NO_ROUTE" in failed.last_error
    assert aware(failed.available_at) >= started + dt.timedelta(seconds=59)
    assert history(app_engine, lost) == [("unroutable", "retry")]


def test_nacked_messages_are_not_marked_published(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    # A queue that holds one message and makes the broker nack anything beyond it.
    exchange = broker.declare_exchange()
    full = broker.declare_queue(
        bind_to=exchange, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    with app_engine.begin() as conn:
        ids = [
            outbox.enqueue(conn, exchange=exchange, routing_key="r", payload=[n]) for n in range(3)
        ]
    relay = relay_factory(db_url, run=False, policy=SLOW_RETRY)
    started = dt.datetime.now(dt.UTC)
    drive_until_settled(relay, 3)

    accepted, *refused = ids
    assert row(app_engine, accepted).state == "published"
    for message_id in refused:
        failed = row(app_engine, message_id)
        assert failed.state == "pending"
        assert failed.published_at is None
        assert failed.attempts == 1
        assert "nack" in failed.last_error
        # Back off before the next attempt (SLOW_RETRY: a minute).
        assert aware(failed.available_at) >= started + dt.timedelta(seconds=59)
        assert history(app_engine, message_id) == [("rejected", "retry")]
    assert broker.depth(full) == 1
    assert states(app_engine) == {"published": 1, "pending": 2}


def test_a_missing_exchange_fails_only_its_own_messages(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    missing = f"t.missing.{uuid.uuid4().hex[:12]}"  # never declared
    with app_engine.begin() as conn:
        doomed = outbox.enqueue(conn, exchange=missing, routing_key="r", payload="doomed")
        fine = outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload="fine")
    relay = relay_factory(db_url, run=False, policy=SLOW_RETRY)
    # Each exchange has its own channel: the 404 closes only the missing one's, and the other
    # message is confirmed on its own channel.
    drive(
        relay,
        lambda _: states(app_engine) == {"pending": 1, "published": 1},
        timeout=10,
        what="one message back to pending, the other published",
    )
    broker.collect_ids([fine])
    failed = row(app_engine, doomed)
    # A missing exchange may come back (deleted and recreated): the message retries with
    # backoff, and the exchange's circuit counts the failure (see test_circuits.py).
    assert failed.state == "pending"
    assert "NOT_FOUND" in failed.last_error or "404" in failed.last_error
    assert history(app_engine, doomed) == [("destination_missing", "retry")]
    assert row(app_engine, fine).attempts == 1
    (circuit,) = [
        r.circuit for r in relay.store.resources() if r.circuit.resource.endswith(missing)
    ]
    assert (circuit.state, circuit.failures) == ("closed", 1)


def test_a_row_that_is_not_a_valid_message_is_dead_lettered(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    with app_engine.begin() as conn:
        bad = outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload={})
        conn.execute(  # written by hand (or by another version): headers that are not an object
            update(message).where(message.c.id == bad).values(headers=["not", "an", "object"])
        )
    relay = relay_factory(db_url, run=False)
    drive_until_settled(relay, 1)
    failed = row(app_engine, bad)
    assert failed.state == "dead"
    assert "malformed" in failed.last_error
    assert history(app_engine, bad) == [("malformed", "dead")]


def test_a_row_the_client_cannot_encode_is_dead_lettered_not_retried_forever(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    with app_engine.begin() as conn:
        bad = outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload={})
        conn.execute(update(message).where(message.c.id == bad).values(headers={"n": 2**70}))
    relay = relay_factory(db_url, run=False)
    drive_until_settled(relay, 1)
    assert row(app_engine, bad).state == "dead"
    assert history(app_engine, bad) == [("malformed", "dead")]
