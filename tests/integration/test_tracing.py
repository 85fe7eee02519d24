"""One trace from the span around `enqueue` to the relay's send span to the consumer's process span.

In-memory span exporter, real PostgreSQL/SQLite and RabbitMQ, in-process relay and consumer.
"""

from __future__ import annotations

import threading
import uuid

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from relay.runtime.telemetry import Telemetry
from tests.support.broker import Broker
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_one_trace_from_enqueue_through_the_relay_to_the_consumer(
    app_engine: Engine,
    db_url: str,
    amqp_url: str,
    broker: Broker,
    relay_factory: RelayFactory,
) -> None:
    provider, exporter = tracing()
    queue = broker.declare_queue(bind_to=broker.exchange)
    for name in (f"{queue}.dead",):
        broker.own(name)
    consumer = outbox.Consumer(
        app_engine, amqp_url, queue, lambda _s, _m: None, tracer_provider=provider
    )
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        relay_factory(db_url, telemetry=Telemetry(tracer=provider.get_tracer("outbox-relay")))
        app = provider.get_tracer("app")
        with (
            app.start_as_current_span("POST /orders") as request,
            Session(app_engine) as session,
            session.begin(),
        ):
            message_id = outbox.enqueue(
                session, exchange=broker.exchange, routing_key="order.created", payload={}
            )
        wait_until(lambda: consumer.processor.counts.get("processed") == 1, timeout=15)
    finally:
        consumer.stop()
        thread.join(10)

    (send,) = wait_until(lambda: named(exporter, "send "), what="the send span")
    (process,) = named(exporter, "process ")
    trace_id = request.get_span_context().trace_id
    assert {send.context.trace_id, process.context.trace_id} == {trace_id}
    assert send.parent is not None
    assert send.parent.span_id == request.get_span_context().span_id
    assert process.parent is not None
    assert process.parent.span_id == send.context.span_id
    assert send.name == f"send {broker.exchange}:order.created"
    assert send.kind is SpanKind.PRODUCER
    assert dict(send.attributes or {}) == {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": f"{broker.exchange}:order.created",
        "messaging.rabbitmq.destination.routing_key": "order.created",
        "messaging.message.id": str(message_id),
        "outbox.attempt": 1,
        "outbox.outcome": "published",
    }
    assert process.kind is SpanKind.CONSUMER
    # The loop's own spans exist, sampled: at most one of a kind per second of running.
    loop = [s.name for s in exporter.get_finished_spans() if s.name.startswith("outbox.relay ")]
    assert {"outbox.relay claim", "outbox.relay publish", "outbox.relay settle"} <= set(loop)
    assert loop.count("outbox.relay claim") <= 20
    # The broker's other consumer got the same traceparent: the send span's context.
    delivered = broker.collect_ids([message_id])[0]
    traceparent = delivered.properties.headers["traceparent"]
    # Flags are not assumed to be 01: newer SDKs also set the random-trace-id bit (03).
    assert traceparent.startswith(f"00-{trace_id:032x}-{send.context.span_id:016x}-")
    assert int(traceparent[-2:], 16) & 1  # sampled


def test_a_dead_lettered_message_shows_why_on_its_send_span(
    app_engine: Engine, db_url: str, broker: Broker, relay_factory: RelayFactory
) -> None:
    provider, exporter = tracing()
    nowhere = broker.declare_exchange()  # no queue bound: unroutable, permanent by default
    relay_factory(db_url, telemetry=Telemetry(tracer=provider.get_tracer("outbox-relay")))
    with app_engine.begin() as conn:
        outbox.enqueue(conn, exchange=nowhere, routing_key=f"r.{uuid.uuid4().hex}", payload="x")
    (send,) = wait_until(lambda: named(exporter, "send "), what="the send span")
    assert (send.attributes or {})["outbox.outcome"] == "dead"
    assert send.status.status_code is StatusCode.ERROR
    (event,) = send.events
    assert event.name == "dead-lettered"
    assert "unroutable" in str((event.attributes or {})["reason"])
