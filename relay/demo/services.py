"""The demo as separate services (docker-compose): a producer writing orders, a consumer.

    outbox-relay demo-producer [--orders N] [--rate R]   orders with their outbox rows, in
                                                         transactions, each in a request span
    outbox-relay demo-consumer                           consumes them with outbox.Consumer

Both print the trace id of each message, so it can be looked up in the tracing backend (Jaeger
in docker-compose) next to the relay's send span. Tracing is configured from the OTEL_*
variables; with none set, spans are still made (trace ids exist) but not exported.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert
from sqlalchemy.orm import Session

import outbox
from relay.amqp import topology
from relay.amqp.nodes import ssl_options
from relay.amqp.tls import TlsOptions
from relay.core.topology import read_topology
from relay.runtime.telemetry import Telemetry, setup

EXCHANGE = "outbox-demo"
QUEUE = "outbox-demo.orders"

_business = MetaData()
order_table = Table(
    "demo_order",
    _business,
    Column("id", Integer, primary_key=True),
    Column("customer", String(64), nullable=False),
    Column("total_cents", Integer, nullable=False),
)


def tracer_provider(telemetry: Telemetry) -> TracerProvider:
    """The exporting provider if OTEL_* set one up, else one that records without exporting."""
    return telemetry.tracer_provider or TracerProvider()


def trace_id_of(span: trace.Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


# The demo's topology, in the file format of `outbox-relay topology apply` (relay/core/topology.py).
TOPOLOGY = """
[[exchanges]]
name = {exchange}
type = "topic"
durable = {durable}
auto_delete = {temporary}

[[queues]]
name = {queue}
durable = {durable}
auto_delete = {temporary}
bindings = [{{ exchange = {exchange}, routing_key = "order.#" }}]
"""


def topology_text(exchange: str, queue: str, *, durable: bool) -> str:
    """The demo's topology file: durable for the services, auto-deleted for `demo`."""
    return TOPOLOGY.format(
        exchange=json.dumps(exchange),  # a JSON string is a TOML basic string
        queue=json.dumps(queue),
        durable=str(durable).lower(),
        temporary=str(not durable).lower(),
    )


def declare(
    amqp_url: str, exchange: str, queue: str, *, durable: bool, tls: TlsOptions | None = None
) -> None:
    """Apply the demo's topology, as `outbox-relay topology apply` would."""
    text = topology_text(exchange, queue, durable=durable)
    topology.apply(amqp_url, read_topology(text, "the demo's topology"), tls=tls)


def write_order(
    engine: Engine, tracer: trace.Tracer, exchange: str, n: int, rng: random.Random, *,
    rollback: bool = False,
) -> tuple[str, str]:  # fmt: skip
    """One order and its outbox message in one transaction, inside a request span.

    Returns (message id, trace id). With `rollback`, the transaction is rolled back (as a failing
    business rule would) and the message never exists.
    """
    message_id: uuid.UUID | None = None
    with tracer.start_as_current_span("POST /orders") as span:
        try:
            with Session(engine) as session, session.begin():
                total = rng.randint(500, 50_000)
                order_id = session.execute(
                    insert(order_table)
                    .values(customer=f"customer-{n % 17}", total_cents=total)
                    .returning(order_table.c.id)
                ).scalar_one()
                message_id = outbox.enqueue(
                    session,
                    exchange=exchange,
                    routing_key="order.created",
                    payload={"order_id": order_id, "total_cents": total},
                    key=f"customer-{n % 17}",
                    headers={"source": "outbox-demo"},
                )
                if rollback:
                    raise _Rollback
        except _Rollback:
            pass
        return str(message_id), trace_id_of(span)


class _Rollback(Exception):
    """Raised inside a transaction to roll it back, as a failing business rule would."""


@contextmanager
def _until_signalled() -> Iterator[list[bool]]:
    stop = [False]

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop[0] = True

    previous = signal.signal(signal.SIGTERM, on_signal), signal.signal(signal.SIGINT, on_signal)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def run_producer(
    db_url: str,
    amqp_url: str,
    *,
    orders: int,
    rate: float,
    exchange: str = EXCHANGE,
    queue: str = QUEUE,
    tls: TlsOptions | None = None,
) -> int:
    from relay.store.engines import make_engine

    telemetry = setup(prometheus=False)
    provider = tracer_provider(telemetry)
    declare(amqp_url, exchange, queue, durable=True, tls=tls)
    engine = make_engine(db_url, autocommit=False)
    outbox.create_schema(engine)
    _business.create_all(engine)
    tracer, rng, n = provider.get_tracer("outbox-demo"), random.Random(), 0
    with _until_signalled() as stop:
        while not stop[0] and (orders == 0 or n < orders):
            n += 1
            message_id, trace_id = write_order(engine, tracer, exchange, n, rng)
            print(f"demo-producer: order {n} message {message_id} trace {trace_id}", flush=True)
            time.sleep(1.0 / rate)
    engine.dispose()
    provider.shutdown()
    return 0


def run_consumer(
    db_url: str,
    amqp_url: str,
    *,
    exchange: str = EXCHANGE,
    queue: str = QUEUE,
    tls: TlsOptions | None = None,
) -> int:
    from relay.store.engines import make_engine

    telemetry = setup(prometheus=False)
    provider = tracer_provider(telemetry)
    declare(amqp_url, exchange, queue, durable=True, tls=tls)
    engine = make_engine(db_url, autocommit=False)
    outbox.create_schema(engine)

    def handle(_session: Session, message: outbox.Message) -> None:
        trace_id = trace_id_of(trace.get_current_span())
        print(f"demo-consumer: received {message.id} trace {trace_id}", flush=True)

    consumer = outbox.Consumer(
        engine, amqp_url, queue, handle, name="outbox-demo", tracer_provider=provider,
        ssl_options=ssl_options(tls),
    )  # fmt: skip
    with _until_signalled() as stop:
        # Signals only set a flag; stop() is safe from this thread once run() has started.
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        while not stop[0] and thread.is_alive():
            time.sleep(0.2)
        consumer.stop()
        thread.join(30)
    engine.dispose()
    provider.shutdown()
    return 0
