"""Declaring an exchange, a queue and a binding: what the demo (and an operator's first run)
needs before the relay publishes; the relay itself never declares."""

from __future__ import annotations

import pika
from pika.exceptions import AMQPError

from relay.core.urls import redact
from relay.errors import BrokerUnavailable


def declare(amqp_url: str, exchange: str, queue: str, binding: str, *, durable: bool) -> None:
    """A topic exchange and a queue bound to it (auto-deleted unless `durable`)."""
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
    try:
        channel = conn.channel()
        channel.exchange_declare(exchange, "topic", durable=durable, auto_delete=not durable)
        channel.queue_declare(queue, durable=durable, auto_delete=not durable)
        channel.queue_bind(queue, exchange, binding)
    finally:
        conn.close()
