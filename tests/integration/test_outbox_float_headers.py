"""Float headers from the producer's enqueue to the consumer's handler, through the real relay:
floats from the first message on, retry copies included, whatever the process did before."""

from __future__ import annotations

import threading
from typing import Any

import pika.data
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from outbox import amqp_codec
from outbox.consumer import dead_queue, retry_queue
from tests.support.broker import Broker
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

FLOATS: dict[str, Any] = {"ratio": 0.25, "negative": -3.5, "large": 1e300, "whole": 2.0}


@pytest.fixture
def stock_pika_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """pika's own decoder, as in a process that never built a consumer (restored afterwards)."""
    monkeypatch.setattr(pika.data, "decode_value", amqp_codec._pika_decode_value)


@pytest.mark.usefixtures("stock_pika_decoder")
def test_float_headers_arrive_as_floats_from_the_first_message(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str, amqp_url: str
) -> None:
    queue = broker.declare_queue(bind_to=broker.exchange)
    broker.own(retry_queue(queue, 1))
    broker.own(dead_queue(queue))
    seen: list[tuple[int, dict[str, Any]]] = []

    def handler(_session: Session, message: outbox.Message) -> None:
        seen.append((message.attempt, dict(message.headers)))
        if message.attempt == 1 and message.json()["n"] == 1:
            raise RuntimeError("first attempt fails: the retry copy must carry the floats")

    assert not amqp_codec.float_decoding_installed()
    policy = outbox.ConsumerPolicy(backoff_base=1.0)
    consumer = outbox.Consumer(app_engine, amqp_url, queue, handler, policy=policy)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert consumer.ready.wait(10)
        with app_engine.begin() as conn:
            for n in (0, 1):
                outbox.enqueue(
                    conn, exchange=broker.exchange, routing_key="r", payload={"n": n},
                    headers=FLOATS, key="k" if n else None,
                )  # fmt: skip
        relay_factory(db_url)
        wait_until(lambda: consumer.processor.counts.get("processed") == 2, timeout=20)
    finally:
        consumer.stop()
        thread.join(10)
    assert consumer.processor.counts == {"processed": 2, "retried": 1}
    assert [attempt for attempt, _ in seen] == [1, 1, 2]
    for _attempt, headers in seen:
        assert {name: headers[name] for name in FLOATS} == FLOATS
        assert all(type(headers[name]) is float for name in FLOATS)
