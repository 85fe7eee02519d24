"""`outbox-relay demo`: the whole path on the embedded default, ending by itself.

Orders are written with their outbox rows in real SQLite transactions (some rolled back), each
inside a request span; an in-process relay publishes them to a local RabbitMQ, and a consumer
counts what arrives and prints each message's trace id (OTEL_TRACES_EXPORTER=console shows the
spans themselves).
"""

from __future__ import annotations

import logging
import random
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

import outbox
from relay.amqp.nodes import ssl_options
from relay.amqp.publisher import Publisher
from relay.amqp.tls import TlsOptions
from relay.core.urls import redact
from relay.demo.services import declare, order_table, tracer_provider, write_order
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.runtime.telemetry import Telemetry, setup
from relay.store.engines import make_engine
from relay.store.sql_store import open_store

log = logging.getLogger("relay.demo")


@dataclass
class _Received:
    """What the demo's consumer saw, by message id."""

    bodies: dict[str, bytes] = field(default_factory=dict)

    def handle(self, _session: Session, message: outbox.Message) -> None:
        self.bodies[message.id] = message.body
        # The relay's send span context: the same trace as the order's request span.
        parent = str(message.headers.get("traceparent", ""))
        trace_id = parent.split("-")[1] if parent.count("-") == 3 else "-"
        print(f"demo: received {message.id} trace {trace_id}")


def run_demo(
    amqp_url: str,
    *,
    orders: int = 300,
    rollback_every: int = 7,
    timeout: float = 60,
    tls: TlsOptions | None = None,
) -> int:
    suffix = uuid.uuid4().hex[:8]
    exchange, queue = f"outbox-demo.{suffix}", f"outbox-demo.orders.{suffix}"
    # auto-deleted: the demo leaves nothing behind on the broker.
    declare(amqp_url, exchange, queue, durable=False, tls=tls)

    workdir = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    db_url = f"sqlite:///{workdir / 'demo.db'}"
    print(f"demo: database {db_url}")
    print(f"demo: broker {redact(amqp_url)}, exchange {exchange}, queue {queue}")
    # The application's engine: transactional, with the relay's SQLite settings (WAL, a busy
    # timeout), since both write the same file.
    app = make_engine(db_url, autocommit=False)
    outbox.create_schema(app)
    order_table.metadata.create_all(app)
    telemetry = setup(prometheus=False)
    provider = tracer_provider(telemetry)
    tracer = provider.get_tracer("outbox-demo")

    # The demo consumes as an application would: outbox.Consumer, its inbox in the same database.
    received_by_id = _Received()
    consumer = outbox.Consumer(
        app, amqp_url, queue, received_by_id.handle, name="outbox-demo",
        ssl_options=ssl_options(tls),
    )  # fmt: skip
    consumer_thread = threading.Thread(target=consumer.run, name="demo-consumer", daemon=True)
    consumer_thread.start()

    config = RelayConfig(db_url=db_url, amqp_url=amqp_url, poll_interval=0.05, relay_id="demo")
    publisher = Publisher(
        amqp_url, confirm_timeout=config.confirm_timeout, name="outbox-demo", tls=tls
    )
    publisher.start()
    relay_telemetry = Telemetry(tracer=provider.get_tracer("outbox-relay"))
    relay = wire_relay(open_store(db_url), publisher, config, telemetry=relay_telemetry)
    relay_thread = threading.Thread(target=relay.run, name="demo-relay", daemon=True)
    relay_thread.start()

    committed: set[str] = set()
    rolled_back: set[str] = set()
    rng = random.Random(7)
    print(f"demo: writing {orders} orders, rolling back every {rollback_every}th transaction")
    for n in range(1, orders + 1):
        rollback = n % rollback_every == 0
        message_id, _ = write_order(app, tracer, exchange, n, rng, rollback=rollback)
        (rolled_back if rollback else committed).add(message_id)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not committed <= received_by_id.bodies.keys():
        time.sleep(0.05)
    time.sleep(0.3)  # a short grace period in which a leaked rolled-back message would show up
    relay.request_stop()
    relay_thread.join(30)
    consumer.stop()
    consumer_thread.join(10)
    relay.store.close()
    app.dispose()
    provider.shutdown()

    received = set(received_by_id.bodies)
    consumer_error = None if not consumer_thread.is_alive() else "consumer did not stop"
    missing = committed - received
    leaked = rolled_back & received
    unexpected = received - committed - rolled_back
    print(
        f"demo: sent {len(committed)}, received {len(received & committed)}, "
        f"rolled back {len(rolled_back)} and never seen {len(rolled_back - received)}"
        + (f"; MISSING {len(missing)}" if missing else "")
        + (f"; LEAKED {len(leaked)}" if leaked else "")
        + (f"; UNEXPECTED {len(unexpected)}" if unexpected else "")
    )
    if consumer_error:
        print(f"demo: {consumer_error}")
    ok = not missing and not leaked and not unexpected and consumer_error is None
    return 0 if ok else 1
