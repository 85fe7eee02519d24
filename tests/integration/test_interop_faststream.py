"""A FastStream RabbitMQ subscriber, with FastStream's own OpenTelemetry middleware, consumes what
the relay published: the payload decodes as enqueued and the consumer's span joins the trace of
the span the message was enqueued in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange, RabbitQueue
from faststream.rabbit.opentelemetry import RabbitTelemetryMiddleware
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, SpanKind
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from relay.runtime.telemetry import Telemetry
from tests.support.broker import Broker
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ORDER = {"order_id": 42, "customer": "Zoë", "total": 12.5}
NOTE = "Grüße, 世界"
BLOB = b"\x00\xff\xfe raw \x80"  # not UTF-8
PAYLOADS: dict[str, object] = {"json": ORDER, "text": NOTE, "bytes": BLOB}


@pytest.mark.parametrize("relay_traces", [True, False], ids=["relay traced", "relay untraced"])
def test_a_faststream_subscriber_decodes_and_joins_the_producers_trace(
    pg_url: str,
    pg_engine: Engine,
    amqp_url: str,
    broker: Broker,
    relay_factory: RelayFactory,
    relay_traces: bool,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = provider.get_tracer("app")
    # FastStream declares its own queues on the test's exchange (same arguments as the fixture's).
    exchange = RabbitExchange(broker.exchange, type=ExchangeType.TOPIC, durable=True)
    names = {kind: broker.own(f"{broker.exchange}.faststream.{kind}") for kind in PAYLOADS}
    got: dict[str, Any] = {}
    telemetry = Telemetry(tracer=provider.get_tracer("outbox-relay")) if relay_traces else None

    async def scenario() -> Span:
        every = asyncio.Event()
        stream = RabbitBroker(
            amqp_url, middlewares=[RabbitTelemetryMiddleware(tracer_provider=provider)]
        )

        @stream.subscriber(RabbitQueue(names["json"], routing_key="interop.json"), exchange)
        async def on_order(body: dict[str, Any]) -> None:
            got["json"] = body
            if len(got) == len(PAYLOADS):
                every.set()

        @stream.subscriber(RabbitQueue(names["text"], routing_key="interop.text"), exchange)
        async def on_note(body: str) -> None:  # FastStream decodes only bare text/plain itself
            got["text"] = body
            if len(got) == len(PAYLOADS):
                every.set()

        @stream.subscriber(RabbitQueue(names["bytes"], routing_key="interop.bytes"), exchange)
        async def on_blob(body: bytes) -> None:
            got["bytes"] = body
            if len(got) == len(PAYLOADS):
                every.set()

        async with stream:
            await stream.start()  # queues declared and bound before anything is published
            with (
                app.start_as_current_span("POST /orders") as request,
                Session(pg_engine) as session,
                session.begin(),
            ):
                for kind, payload in PAYLOADS.items():
                    outbox.enqueue(
                        session,
                        exchange=broker.exchange,
                        routing_key=f"interop.{kind}",
                        payload=payload,
                    )
            relay_factory(pg_url, telemetry=telemetry)  # publishes from its own thread
            await asyncio.wait_for(every.wait(), timeout=20)
        return request

    request = asyncio.run(scenario())
    assert got == PAYLOADS

    trace_id, request_id = request.get_span_context().trace_id, request.get_span_context().span_id
    sends = send_spans(exporter)
    if relay_traces:
        # A send span ends at the broker's confirm, which may come after the delivery.
        wait_until(lambda: len(send_spans(exporter)) == len(PAYLOADS), what="the send spans")
        sends = send_spans(exporter)
        assert [s.parent.span_id if s.parent else None for s in sends] == [request_id] * 3
    else:
        assert sends == []
    # Each process span is a child of what the message carried: the relay's send span when the
    # relay traces, else the span the message was enqueued in. The producer's trace either way.
    parents = {s.context.span_id for s in sends} if relay_traces else {request_id}
    wait_until(lambda: len(process_spans(exporter)) == len(PAYLOADS), what="the process spans")
    for span in process_spans(exporter):
        assert span.name in {f"{broker.exchange}.interop.{kind} process" for kind in names}
        assert span.context.trace_id == trace_id, span.name
        assert span.parent is not None, span.name
        assert span.parent.span_id in parents, span.name


def process_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """FastStream's consumer spans (`{exchange}.{routing key} process`)."""
    return [
        s
        for s in exporter.get_finished_spans()
        if s.kind is SpanKind.CONSUMER and s.name.endswith(" process")
    ]


def send_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """The relay's spans (`send {exchange}:{routing key}`)."""
    return [s for s in exporter.get_finished_spans() if s.name.startswith("send ")]
