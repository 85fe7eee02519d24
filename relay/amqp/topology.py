"""Declaring an exchange, a queue and a binding: what the demo (and an operator's first run)
needs before the relay publishes; the relay itself never declares."""

from __future__ import annotations

import pika
from pika.exceptions import AMQPError

from relay.amqp.connect_errors import tls_problem
from relay.amqp.nodes import broker_nodes
from relay.amqp.tls import TlsOptions
from relay.core.urls import redact
from relay.errors import BrokerUnavailable


def declare(
    amqp_url: str,
    exchange: str,
    queue: str,
    binding: str,
    *,
    durable: bool,
    tls: TlsOptions | None = None,
) -> None:
    """A topic exchange and a queue bound to it (auto-deleted unless `durable`), through the
    first node of `amqp_url` that answers."""
    nodes = broker_nodes(amqp_url, tls)
    for node in nodes:
        node.params.socket_timeout = 3
        node.params.connection_attempts = 1
    try:
        # pika tries the nodes in order.
        conn = pika.BlockingConnection([node.params for node in nodes])
    except AMQPError as exc:
        problem = tls_problem(exc)
        if problem is not None:
            raise BrokerUnavailable(
                f"cannot reach RabbitMQ at {redact(amqp_url)}: {problem}"
            ) from None
        raise BrokerUnavailable(
            f"cannot reach RabbitMQ at {redact(amqp_url)} ({type(exc).__name__}); start one with "
            "`docker compose up -d rabbitmq` (or `rabbitmq-server -detached`), or pass --amqp URL"
        ) from None
    try:
        channel = conn.channel()
        channel.exchange_declare(exchange, "topic", durable=durable, auto_delete=not durable)
        channel.queue_declare(queue, durable=durable, auto_delete=not durable)
        channel.queue_bind(queue, exchange, binding)
    finally:
        conn.close()
