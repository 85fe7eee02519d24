"""outbox.testing, as an application's tests use it: on the caller's own transaction, on both
databases, with no broker."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import outbox
from outbox.testing import EnqueuedMessage, assert_enqueued, assert_not_enqueued, enqueued


def place_order(session: Session, order_id: int) -> uuid.UUID:
    """The application code under test: an order row and its announcement, one transaction."""
    session.execute(text("SELECT 1"))  # stands in for the business write
    return outbox.enqueue(
        session,
        exchange="orders",
        routing_key="order.created",
        payload={"id": order_id, "total": 12.5},
        key=str(order_id),
        headers={"tenant": "acme", "ratio": 0.25},
    )


def test_an_uncommitted_message_is_seen_in_the_callers_transaction(app_engine: Engine) -> None:
    with Session(app_engine) as session, session.begin():
        sent = place_order(session, 17)
        (found,) = assert_enqueued(
            session,
            exchange="orders",
            routing_key="order.created",
            payload={"id": 17, "total": 12.5},
            key="17",
            headers={"tenant": "acme"},  # a subset of the headers is enough
        )
        assert found.id == sent
        assert found.headers == {"tenant": "acme", "ratio": 0.25}
        assert found.content_type == "application/json"
        assert found.body == b'{"id":17,"total":12.5}'
        assert found.state == "pending"
        session.rollback()
    with Session(app_engine) as session:
        assert enqueued(session) == []  # rolled back: the message never existed


def test_filters_combine_and_come_back_in_enqueue_order(app_engine: Engine) -> None:
    with app_engine.connect() as conn, conn.begin():
        a = outbox.enqueue(conn, exchange="orders", routing_key="a", payload="plain text")
        b = outbox.enqueue(conn, exchange="orders", routing_key="b", payload=b"\x00\x01", key="k")
        c = outbox.enqueue(conn, exchange="audit", routing_key="a", payload=["x"], key="k")
        d = outbox.enqueue(
            conn, exchange="orders", routing_key="a", payload=b"{}", content_type="text/csv"
        )

        def ids(messages: list[EnqueuedMessage]) -> list[uuid.UUID]:
            return [m.id for m in messages]

        assert ids(enqueued(conn)) == [a, b, c, d]
        assert ids(enqueued(conn, exchange="orders")) == [a, b, d]
        assert ids(enqueued(conn, routing_key="a", exchange="orders")) == [a, d]
        assert ids(enqueued(conn, key="k")) == [b, c]
        assert ids(enqueued(conn, key=None)) == [a, d]  # None: no ordering key
        assert ids(enqueued(conn, payload="plain text")) == [a]  # text/plain decoded
        assert ids(enqueued(conn, payload=b"\x00\x01")) == [b]  # bytes: the body as sent
        assert ids(enqueued(conn, payload=["x"])) == [c]  # JSON decoded
        assert ids(enqueued(conn, payload="{}", content_type="text/csv")) == [d]
        assert ids(enqueued(conn, headers={"tenant": "acme"})) == []
        assert enqueued(conn, exchange="orders", routing_key="b")[0].payload == b"\x00\x01"


def test_a_failed_assertion_lists_what_was_enqueued(app_engine: Engine) -> None:
    with Session(app_engine) as session, session.begin():
        place_order(session, 17)
        with pytest.raises(AssertionError) as failed:
            assert_enqueued(session, exchange="orders", payload={"id": 18})
        message = str(failed.value)
        assert "exchange='orders', payload={'id': 18}; none matches" in message
        assert "1 enqueued:" in message
        assert "'orders' / 'order.created' key='17' payload={'id': 17, 'total': 12.5}" in message

        place_order(session, 17)
        assert len(assert_enqueued(session, key="17", count=2)) == 2
        with pytest.raises(AssertionError, match="expected 1 message"):
            assert_enqueued(session, key="17", count=1)


def test_assert_not_enqueued(app_engine: Engine) -> None:
    with Session(app_engine) as session, session.begin():
        assert_not_enqueued(session)
        place_order(session, 17)
        assert_not_enqueued(session, key="18")
        with pytest.raises(AssertionError, match=r"expected no message enqueued with key='17'"):
            assert_not_enqueued(session, key="17")


def test_an_unknown_filter_is_a_type_error(app_engine: Engine) -> None:
    with app_engine.connect() as conn, pytest.raises(TypeError, match="routing_key"):
        enqueued(conn, routingkey="a")  # type: ignore[call-arg]


def test_reading_does_not_flush_the_callers_objects(app_engine: Engine) -> None:
    # Like enqueue, the helpers read through Session.connection(): nothing the caller added to
    # the session is flushed (or fails) because a test looked at the outbox.
    with Session(app_engine) as session, session.begin():
        place_order(session, 1)
        assert not session.new
        assert len(enqueued(session)) == 1
