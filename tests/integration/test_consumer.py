"""The consumer helper against the real broker and databases: effectively-once processing.

Every message is delivered twice and the handler's side effects happen once; a crash between
commit and ack is absorbed by the inbox; failures retry through the broker or are dead-lettered
with their reason; the consumer's span joins the producer's trace.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import outbox
from outbox.consumer import (
    ATTEMPT_HEADER,
    ERROR_HEADER,
    ConsumerPolicy,
    Handler,
    dead_queue,
    retry_queue,
)
from tests.conftest import Broker, amqp_connection, wait_until


@pytest.fixture
def effects(app_engine: Engine) -> Engine:
    """A table the handlers write their side effects to, in the consumer's transaction."""
    with app_engine.begin() as conn:
        conn.execute(text("CREATE TABLE consumer_effects (message_id VARCHAR(64), note TEXT)"))
    return app_engine


def effect_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT message_id, count(*) FROM consumer_effects GROUP BY message_id")
        )
        return {str(m): int(n) for m, n in rows}


def record_effect(session: Session, message: outbox.Message) -> None:
    session.execute(
        text("INSERT INTO consumer_effects (message_id, note) VALUES (:m, :n)"),
        {"m": message.id, "n": message.text()},
    )


def props(message_id: str | None, **headers: Any) -> pika.BasicProperties:
    return pika.BasicProperties(
        message_id=message_id, content_type="text/plain", delivery_mode=2, headers=headers or None
    )


@pytest.fixture
def queue(broker: Broker) -> str:
    name = broker.declare_queue()
    for delay in (1, 2, 4, 8):
        broker.own(retry_queue(name, delay))
    broker.own(dead_queue(name))
    return name


@pytest.fixture
def run_consumer(
    amqp_url: str,
) -> Iterator[Callable[..., outbox.Consumer]]:
    running: list[tuple[outbox.Consumer, threading.Thread]] = []

    def start(engine: Engine, queue: str, handler: Handler, **kw: Any) -> Any:
        consumer = outbox.Consumer(engine, amqp_url, queue, handler, **kw)
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        assert consumer.ready.wait(10), "the consumer did not start"
        running.append((consumer, thread))
        return consumer

    yield start
    for consumer, thread in running:
        consumer.stop()
        thread.join(10)
        assert not thread.is_alive(), "run() did not return after stop()"


def test_every_message_delivered_twice_is_processed_once(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    ids = [str(uuid.uuid4()) for _ in range(25)]
    for message_id in ids:
        for copy in ("first", "second"):  # the broker's at-least-once, made certain
            broker.publish(queue, copy.encode(), props(message_id))
    consumer = run_consumer(effects, queue, record_effect)
    counts = consumer.processor.counts
    wait_until(lambda: counts.get("processed", 0) + counts.get("duplicate", 0) == 50)
    assert counts == {"processed": 25, "duplicate": 25}
    assert effect_counts(effects) == dict.fromkeys(ids, 1)
    with effects.connect() as conn:
        inbox = conn.execute(text("SELECT count(*) FROM outbox_inbox")).scalar_one()
    assert inbox == 25
    assert broker.depth(queue) == 0


def test_a_crash_between_commit_and_ack_does_not_run_the_handler_again(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    message_id = str(uuid.uuid4())
    broker.publish(queue, b"once", props(message_id))

    class AckLost:
        """The consuming channel, except that the ack never reaches the broker."""

        def __init__(self, channel: Any) -> None:
            self._channel = channel

        def basic_ack(self, _tag: int) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            return getattr(self._channel, name)

    first = amqp_connection()
    channel = first.channel()
    method, properties, body = channel.basic_get(queue, auto_ack=False)
    assert method is not None
    processor = outbox.Processor(effects, record_effect, consumer=queue, queue=queue)
    assert processor(AckLost(channel), method, properties, body) == "processed"
    first.close()  # the crash: the unacked delivery goes back to the queue

    consumer = run_consumer(effects, queue, record_effect)
    wait_until(lambda: consumer.processor.counts.get("duplicate") == 1)
    assert effect_counts(effects) == {message_id: 1}


def test_a_failing_handler_is_retried_through_the_broker_then_succeeds(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    attempts: list[int] = []

    def flaky(session: Session, message: outbox.Message) -> None:
        attempts.append(message.attempt)
        record_effect(session, message)  # rolled back with the failure
        if message.attempt == 1:
            raise RuntimeError("downstream timed out")

    message_id = str(uuid.uuid4())
    broker.publish(queue, b"retry me", props(message_id))
    consumer = run_consumer(effects, queue, flaky, policy=ConsumerPolicy(backoff_base=1.0))
    wait_until(lambda: consumer.processor.counts.get("processed") == 1, timeout=15)
    assert attempts == [1, 2]
    assert consumer.processor.counts == {"retried": 1, "processed": 1}
    assert effect_counts(effects) == {message_id: 1}
    assert broker.depth(retry_queue(queue, 1)) == 0


def test_reject_and_exhausted_attempts_are_dead_lettered_with_their_reason(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    def handler(session: Session, message: outbox.Message) -> None:
        record_effect(session, message)
        if message.text() == "poison":
            raise outbox.Reject("order 17 does not exist")
        raise ValueError("always fails")

    poison, failing = str(uuid.uuid4()), str(uuid.uuid4())
    broker.publish(queue, b"poison", props(poison))
    broker.publish(queue, b"failing", props(failing))
    broker.publish(queue, b"anonymous", props(None))
    policy = ConsumerPolicy(max_attempts=2, backoff_base=1.0)
    consumer = run_consumer(effects, queue, handler, policy=policy)
    wait_until(lambda: consumer.processor.counts.get("dead") == 3, timeout=15)
    assert effect_counts(effects) == {}  # every failed attempt rolled back
    with effects.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_inbox")).scalar_one() == 0

    dead: dict[str | None, Any] = {}
    reader = amqp_connection()
    try:
        channel = reader.channel()
        while True:
            method, properties, _body = channel.basic_get(dead_queue(queue), auto_ack=True)
            if method is None:
                break
            dead[properties.message_id] = properties.headers
    finally:
        reader.close()
    assert set(dead) == {poison, failing, None}
    assert "Reject: order 17 does not exist" in dead[poison][ERROR_HEADER]
    assert "gave up after 2 attempts: ValueError: always fails" in dead[failing][ERROR_HEADER]
    assert dead[failing][ATTEMPT_HEADER] == 2
    assert "no message_id" in dead[None][ERROR_HEADER]


def test_the_process_span_joins_the_producers_trace(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace_id, parent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    message_id = str(uuid.uuid4())
    broker.publish(
        queue, b"traced", props(message_id, traceparent=f"00-{trace_id}-{parent_span}-01")
    )
    consumer = run_consumer(effects, queue, record_effect, tracer_provider=provider)
    wait_until(lambda: consumer.processor.counts.get("processed") == 1)
    (span,) = exporter.get_finished_spans()
    assert span.name == f"process {queue}"
    assert span.kind is SpanKind.CONSUMER
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == parent_span
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "rabbitmq"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == message_id
    assert attributes["outbox.consumer.outcome"] == "processed"


def test_process_once_is_idempotent_per_consumer(app_engine: Engine) -> None:
    with Session(app_engine) as session, session.begin():
        assert outbox.process_once(session, consumer="billing", message_id="m1")
        assert not outbox.process_once(session, consumer="billing", message_id="m1")
        assert outbox.process_once(session, consumer="shipping", message_id="m1")
    with Session(app_engine) as session, session.begin():
        assert not outbox.process_once(session, consumer="billing", message_id="m1")
    with pytest.raises(outbox.OutboxError), Session(app_engine) as session, session.begin():
        outbox.process_once(session, consumer="", message_id="m1")
    import datetime as dt

    assert outbox.purge_inbox(app_engine, older_than=dt.timedelta(days=1)) == 0
    assert outbox.purge_inbox(app_engine, older_than=dt.timedelta(seconds=-1)) == 2
