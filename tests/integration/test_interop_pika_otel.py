"""A pika consumer instrumented by opentelemetry-instrumentation-pika joins the trace of the span
the message was enqueued in.

The instrumentation is applied to the whole process (as `opentelemetry-instrument` would), before
the relay and the consumer connect, and removed at teardown. It must really instrument: a
version that installs and does nothing (0.44b0 with OpenTelemetry 1.45) makes no consumer span,
and the test fails on that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest
from opentelemetry.instrumentation.pika import PikaInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from tests.support.broker import AMQP_URL, Broker
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def pika_traced(broker: Broker) -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """pika instrumented process-wide into an in-memory exporter; uninstrumented at teardown.

    Takes `broker` so that fixture's own connection is opened before, and stays uninstrumented.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = PikaInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        instrumentor.uninstrument()


def test_an_instrumented_pika_consumer_joins_the_producers_trace(
    pg_url: str,
    pg_engine: Engine,
    broker: Broker,
    relay_factory: RelayFactory,
    pika_traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = pika_traced
    queue = broker.declare_queue(bind_to=broker.exchange, binding_key="interop.#")
    received: list[tuple[Any, bytes]] = []

    params = pika.URLParameters(AMQP_URL)
    params.heartbeat = 0  # the test thread does not service heartbeats between polls
    conn = pika.BlockingConnection(params)
    try:
        channel = conn.channel()  # instrumented: the instrumentation wraps channel()
        channel.basic_consume(
            queue,
            lambda ch, method, props, body: received.append((props, body)),
            auto_ack=True,
        )
        with (
            provider.get_tracer("app").start_as_current_span("POST /orders") as request,
            Session(pg_engine) as session,
            session.begin(),
        ):
            message_id = outbox.enqueue(
                session,
                exchange=broker.exchange,
                routing_key="interop.pika",
                payload={"order_id": 42},
            )
        relay_factory(pg_url)
        wait_until(
            lambda: conn.process_data_events(time_limit=0.05) or received, what="the message"
        )
    finally:
        conn.close()

    ((props, body),) = received
    assert (props.message_id, body) == (str(message_id), b'{"order_id":42}')
    spans = consumer_spans(exporter, broker.exchange)
    assert len(spans) == 1, (
        f"opentelemetry-instrumentation-pika made {len(spans)} consumer spans, not 1: it does "
        "not instrument this pika (a release that does not match the OpenTelemetry API?)"
    )
    (span,) = spans
    context = request.get_span_context()
    # The instrumentation's span is a child of the traceparent the message carried: the span
    # enqueue ran in (this relay does not trace), so one trace from the request to the consumer.
    assert span.context.trace_id == context.trace_id
    assert span.parent is not None
    assert span.parent.span_id == context.span_id
    assert (span.attributes or {})["messaging.message.id"] == str(message_id)
    # What the relay sent is the enqueue span's context, not one the instrumentation made up on
    # publish (flags not assumed: newer SDKs also set the random-trace-id bit).
    traceparent = props.headers["traceparent"]
    assert traceparent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")


def consumer_spans(exporter: InMemorySpanExporter, exchange: str) -> list[ReadableSpan]:
    """The instrumentation's consumer spans for deliveries from `exchange`."""
    return [
        s
        for s in exporter.get_finished_spans()
        if s.kind is SpanKind.CONSUMER and s.name == f"{exchange} receive"
    ]
