"""`outbox-relay demo`: the whole path on the embedded default, ending by itself.

Orders are written with their outbox rows in real SQLite transactions (some rolled back), an
in-process relay publishes them to a local RabbitMQ, and a consumer counts what arrives.
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
from typing import Any

import pika
from pika.exceptions import AMQPError
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.orm import Session

import outbox
from relay.config import RelayConfig, redact
from relay.errors import BrokerUnavailable
from relay.publisher import Publisher
from relay.relay import Relay
from relay.store.sql_store import make_engine, open_store

log = logging.getLogger("relay.demo")

_business = MetaData()
order_table = Table(
    "demo_order",
    _business,
    Column("id", Integer, primary_key=True),
    Column("customer", String(64), nullable=False),
    Column("total_cents", Integer, nullable=False),
)


class _Rollback(Exception):
    """Raised inside a transaction to roll it back, as a failing business rule would."""


@dataclass
class _Consumer:
    amqp_url: str
    queue: str
    received: dict[str, bytes] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
            channel = conn.channel()
            channel.basic_qos(prefetch_count=500)

            def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
                self.received[props.message_id] = body
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume(self.queue, on_message)
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.1)
            conn.close()
        except AMQPError as exc:  # pragma: no cover - reported in the summary
            self.error = f"consumer failed: {exc!r}"


def _declare(amqp_url: str, exchange: str, queue: str) -> None:
    try:
        params = pika.URLParameters(amqp_url)
        params.socket_timeout = 3
        params.connection_attempts = 1
        conn = pika.BlockingConnection(params)
    except AMQPError as exc:
        raise BrokerUnavailable(
            f"cannot reach RabbitMQ at {redact(amqp_url)} ({type(exc).__name__}); start one with "
            "`docker compose up -d rabbitmq` (or `rabbitmq-server -detached`), or pass --amqp URL"
        ) from None
    channel = conn.channel()
    # auto_delete/exclusive: the demo leaves nothing behind on the broker.
    channel.exchange_declare(exchange, "topic", auto_delete=True)
    channel.queue_declare(queue, auto_delete=True)
    channel.queue_bind(queue, exchange, "order.#")
    conn.close()


def run_demo(
    amqp_url: str, *, orders: int = 300, rollback_every: int = 7, timeout: float = 60
) -> int:
    suffix = uuid.uuid4().hex[:8]
    exchange, queue = f"outbox-demo.{suffix}", f"outbox-demo.orders.{suffix}"
    _declare(amqp_url, exchange, queue)

    workdir = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    db_url = f"sqlite:///{workdir / 'demo.db'}"
    print(f"demo: database {db_url}")
    print(f"demo: broker {redact(amqp_url)}, exchange {exchange}, queue {queue}")
    # The application's engine: transactional, with the relay's SQLite settings (WAL, a busy
    # timeout), since both write the same file.
    app = make_engine(db_url, autocommit=False)
    outbox.create_schema(app)
    _business.create_all(app)

    consumer = _Consumer(amqp_url, queue)
    consumer_thread = threading.Thread(target=consumer.run, name="demo-consumer", daemon=True)
    consumer_thread.start()

    config = RelayConfig(db_url=db_url, amqp_url=amqp_url, poll_interval=0.05, relay_id="demo")
    publisher = Publisher(amqp_url, confirm_timeout=config.confirm_timeout, name="outbox-demo")
    publisher.start()
    relay = Relay(open_store(db_url), publisher, config)
    relay_thread = threading.Thread(target=relay.run, name="demo-relay", daemon=True)
    relay_thread.start()

    committed: set[str] = set()
    rolled_back: set[str] = set()
    rng = random.Random(7)
    print(f"demo: writing {orders} orders, rolling back every {rollback_every}th transaction")
    for n in range(1, orders + 1):
        message_id: uuid.UUID | None = None
        try:
            with Session(app) as session, session.begin():
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
                if n % rollback_every == 0:
                    raise _Rollback
            committed.add(str(message_id))
        except _Rollback:
            rolled_back.add(str(message_id))

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not committed <= consumer.received.keys():
        time.sleep(0.05)
    time.sleep(0.3)  # a short grace period in which a leaked rolled-back message would show up
    relay.request_stop()
    relay_thread.join(30)
    consumer.stop.set()
    consumer_thread.join(10)
    relay.store.close()
    app.dispose()

    received = set(consumer.received)
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
    if consumer.error:
        print(f"demo: {consumer.error}")
    ok = not missing and not leaked and not unexpected and consumer.error is None
    return 0 if ok else 1
