"""A plain kombu consumer (what Celery is built on) reads what the relay published: JSON, text and
bytes each decode to what was enqueued (kombu's own decoder, the properties as the broker
delivered them)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Consumer
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from tests.support.broker import Broker
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# What a kombu consumer of the outbox lists in `accept` (the content types as sent, exactly:
# kombu compares the whole string); "json" is kombu's alias for application/json.
ACCEPT = ["json", "text/plain; charset=utf-8", "application/octet-stream"]


@pytest.fixture
def kombu_connection(amqp_url: str) -> Iterator[Any]:
    # kombu's constructors carry no annotations: each call is marked for mypy strict.
    with Connection(amqp_url, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]
        yield conn


def test_kombu_decodes_json_text_and_bytes_as_enqueued(
    pg_url: str,
    pg_engine: Engine,
    broker: Broker,
    relay_factory: RelayFactory,
    kombu_connection: Any,
) -> None:
    # kombu declares its own queue on the test's exchange, as a kombu application would.
    name = broker.own(f"{broker.exchange}.kombu")
    exchange = Exchange(broker.exchange, type="topic", durable=True)  # type: ignore[no-untyped-call]
    queue = Queue(name, exchange, routing_key="interop.#")  # type: ignore[no-untyped-call]
    received: dict[str, dict[str, Any]] = {}

    def on_message(body: Any, message: Any) -> None:
        received[message.properties["message_id"]] = {
            "body": body,
            "decoded": message.decode(),
            "content_type": message.content_type,
            "content_encoding": message.content_encoding,
            "headers": message.headers,
        }
        message.ack()

    payloads: dict[str, object] = {
        "json": {"order_id": 42, "customer": "Zoë", "lines": [1.5, None, True]},
        "text": "Grüße, 世界",
        "bytes": b"\x00\xff\xfe raw \x80",  # not UTF-8: kombu must hand it over undecoded
    }
    consumer = Consumer(  # type: ignore[no-untyped-call]
        kombu_connection, queues=[queue], callbacks=[on_message], accept=ACCEPT, prefetch_count=10
    )
    with consumer:  # declares and binds the queue before anything is published
        with Session(pg_engine) as session, session.begin():
            ids = {
                kind: str(
                    outbox.enqueue(
                        session,
                        exchange=broker.exchange,
                        routing_key=f"interop.{kind}",
                        payload=payload,
                        key=f"k-{kind}",
                    )
                )
                for kind, payload in payloads.items()
            }
        relay_factory(pg_url)
        receive(kombu_connection, lambda: len(received) == 3, what="3 messages")

    expected = {
        "json": ("application/json", "utf-8"),
        "text": ("text/plain; charset=utf-8", "utf-8"),
        "bytes": ("application/octet-stream", "binary"),
    }
    for kind, payload in payloads.items():
        got = received[ids[kind]]
        assert got["body"] == payload, kind
        assert got["decoded"] == payload, kind
        assert type(got["decoded"]) is type(payload), kind
        assert (got["content_type"], got["content_encoding"]) == expected[kind]
        assert got["headers"]["x-outbox-key"] == f"k-{kind}"


def receive(connection: Any, done: Callable[[], bool], *, what: str) -> None:
    """Let kombu hand arriving messages to the consumer's callbacks until `done()`."""

    def arrived() -> bool:
        with contextlib.suppress(socket.timeout):
            connection.drain_events(timeout=0.1)
        return done()

    wait_until(arrived, timeout=15, what=what)
