"""Instrumentation of pika cannot break the trace a message carries.

opentelemetry-instrumentation-pika (what `opentelemetry-instrument` and the OpenTelemetry
Operator load) wraps each new channel's `basic_publish` and writes a new root span's context over
the `traceparent` header. The relay goes around it: here the real instrumentor runs under
`opentelemetry-instrument` around `outbox-relay run`, and in this process after the relay
started; a wrapper that ignores OpenTelemetry's suppression flag is put on pika's class before the
relay imports it; and the publisher's thread is checked to run with that flag set.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import pika
import pytest
from opentelemetry.instrumentation.pika import PikaInstrumentor
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span
from pika.connection import Connection
from sqlalchemy import Engine

import outbox
from relay.amqp.publisher import Publisher
from relay.runtime.telemetry import Telemetry
from tests.e2e.test_telemetry_cli import json_documents
from tests.support.broker import AMQP_URL, Broker, amqp_connection
from tests.support.cli import environment
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BIN = Path(sys.executable).parent
FORGED = f"00-{'f' * 32}-{'f' * 16}-01"
# Loaded by the relay's interpreter before anything else, as an APM agent's bootstrap is: a
# class-level wrapper of pika's basic_publish that writes its own traceparent and knows nothing
# of OpenTelemetry's suppression flag.
HOSTILE_SITECUSTOMIZE = f"""
import pika.channel
import wrapt


def forge(wrapped, instance, args, kwargs):
    properties = args[3] if len(args) > 3 else kwargs["properties"]
    properties.headers = {{**(properties.headers or {{}}), "traceparent": "{FORGED}"}}
    return wrapped(*args, **kwargs)


wrapt.wrap_function_wrapper(pika.channel.Channel, "basic_publish", forge)
"""


def enqueue_in_a_request(engine: Engine, exchange: str) -> tuple[uuid.UUID, Span]:
    app = TracerProvider().get_tracer("app")
    with app.start_as_current_span("POST /orders") as request, engine.begin() as conn:
        message_id = outbox.enqueue(
            conn, exchange=exchange, routing_key="order.created", payload={"id": 7}
        )
    return message_id, request


def trace_id(traceparent: str) -> str:
    return traceparent.split("-")[1]


def run_relay(
    prefix: Sequence[str], db_url: str, ids: Sequence[uuid.UUID], broker: Broker, **env: str
) -> tuple[str, str]:
    """`outbox-relay run` behind `prefix` until `ids` arrived; its stdout and stderr."""
    process = subprocess.Popen(
        [*prefix, str(BIN / "outbox-relay"), "--db", db_url, "--amqp", AMQP_URL, "run",
         "--poll-interval", "0.05", "--drain-timeout", "5"],
        env=environment(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        broker.collect_ids(ids, timeout=30)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return out, err


def test_under_opentelemetry_instrument_the_consumer_joins_the_producers_trace(
    pg_engine: Engine, pg_url: str, broker: Broker
) -> None:
    message_id, request = enqueue_in_a_request(pg_engine, broker.exchange)
    out, err = run_relay(
        [str(BIN / "opentelemetry-instrument")],
        pg_url,
        [message_id],
        broker,
        OTEL_SERVICE_NAME="billing-relay",
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    # The instrumentor really patched pika in the relay's process (a release that installs but
    # instruments nothing would leave this line out).
    assert "broker.instrumentation_bypassed wrapped=pika.connection.Connection.channel" in err
    (delivery,) = broker.received
    context = request.get_span_context()
    traceparent = delivery.properties.headers["traceparent"]
    assert trace_id(traceparent) == f"{context.trace_id:032x}"
    spans = json_documents(out)
    (send,) = [s for s in spans if s["name"] == f"send {broker.exchange}:order.created"]
    assert send["context"]["trace_id"] == f"0x{context.trace_id:032x}"
    assert send["parent_id"] == f"0x{context.span_id:016x}"
    assert traceparent.split("-")[2] == send["context"]["span_id"][2:]
    assert send["resource"]["attributes"]["service.name"] == "billing-relay"
    # Nor did the instrumentation make a root span of its own for the relay's publish.
    assert [s["name"] for s in spans if s["name"].endswith(" send")] == [], out


def test_a_wrapper_on_pikas_class_that_ignores_suppression_is_gone_around(
    pg_engine: Engine, pg_url: str, broker: Broker, tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(HOSTILE_SITECUSTOMIZE)
    message_id, request = enqueue_in_a_request(pg_engine, broker.exchange)
    _, err = run_relay([], pg_url, [message_id], broker, PYTHONPATH=str(tmp_path))
    assert "broker.instrumentation_bypassed wrapped=pika.channel.Channel.basic_publish" in err
    (delivery,) = broker.received
    traceparent = delivery.properties.headers["traceparent"]
    assert traceparent != FORGED
    assert trace_id(traceparent) == f"{request.get_span_context().trace_id:032x}"


def test_a_pika_instrumentor_installed_after_the_relay_started_leaves_its_messages_alone(
    pg_engine: Engine, pg_url: str, broker: Broker, relay_factory: RelayFactory
) -> None:
    exporter = InMemorySpanExporter()
    relay_exporter = InMemorySpanExporter()
    pika_provider, relay_provider = TracerProvider(), TracerProvider()
    pika_provider.add_span_processor(SimpleSpanProcessor(exporter))
    relay_provider.add_span_processor(SimpleSpanProcessor(relay_exporter))
    relay_factory(pg_url, telemetry=Telemetry(tracer=relay_provider.get_tracer("outbox-relay")))
    instrumentor = PikaInstrumentor()
    instrumentor.instrument(tracer_provider=pika_provider)
    control = uuid.uuid4()
    conn = amqp_connection()
    try:
        assert hasattr(Connection.channel, "__wrapped__")
        # A channel of anyone else's, opened now, is instrumented: its message gets a new trace.
        conn.channel().basic_publish(
            broker.exchange, "control", b"", pika.BasicProperties(message_id=str(control))
        )
        # The relay opens its channel for this exchange now, under the instrumentation.
        message_id, request = enqueue_in_a_request(pg_engine, broker.exchange)
        broker.collect_ids([control, message_id])
    finally:
        conn.close()
        instrumentor.uninstrument()
    assert not hasattr(Connection.channel, "__wrapped__")  # nothing left for the next test
    by_id = {d.message_id: d for d in broker.received}
    pika_spans = exporter.get_finished_spans()
    assert {(s.attributes or {}).get("messaging.message.id") for s in pika_spans} == {str(control)}
    control_trace = trace_id(by_id[str(control)].properties.headers["traceparent"])
    assert control_trace in {f"{s.context.trace_id:032x}" for s in pika_spans}
    traceparent = by_id[str(message_id)].properties.headers["traceparent"]
    (send,) = wait_until(
        lambda: [s for s in relay_exporter.get_finished_spans() if s.name.startswith("send ")],
        what="the relay's send span",
    )
    assert trace_id(traceparent) == f"{request.get_span_context().trace_id:032x}"
    assert traceparent.split("-")[2] == f"{send.context.span_id:016x}"


def test_the_publishers_work_runs_with_instrumentation_suppressed(amqp_url: str) -> None:
    publisher = Publisher(amqp_url)
    publisher.start()
    seen: list[bool] = []
    try:
        # `done` runs inside the publisher's work (at once here: nothing to send), where every
        # publish happens; the caller's context is as it was once publish() returns.
        publisher.publish([], lambda _outcomes: seen.append(is_instrumentation_enabled()))
        wait_until(lambda: seen, what="the publisher's callback")
    finally:
        publisher.stop()
    assert seen == [False]
    assert is_instrumentation_enabled()  # the caller's own thread is left as it was
