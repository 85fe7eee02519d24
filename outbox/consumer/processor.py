"""One delivery: dedupe through the inbox, run the handler in a transaction, then ack, retry or
dead-letter it.

The handler runs in a transaction together with an inbox record keyed by the message id
(outbox/consumer/inbox.py), so a redelivered or duplicated message is recognised and acknowledged
without running the handler again; the delivery is acknowledged only after that transaction
commits. A handler that raises is retried through the broker or dead-lettered, as
outbox/consumer/policy.py decides: the copy goes to `<queue>.retry.<N>s` (a queue whose TTL sends
it back after N seconds) or to `<queue>.dead`, with the reason in its headers. The copy is
confirmed by the broker before the original is acknowledged, so a crash in between duplicates a
message (the inbox absorbs it) but never loses one. Where that transaction runs is the
processor's `Transactions` (outbox/consumer/transactions.py): a SQLAlchemy `Session` for
`Processor`, Django's connection for `outbox.django`.

Nothing here sleeps: a pause (before putting a delivery back while the database is down, before
running a handler again after its transaction lost a race) is scheduled on the connection
(`call_later`), so pika keeps serving heartbeats, other channels and `stop()` meanwhile. A
delivery waiting on such a pause is still unacknowledged: if the connection closes first, the
broker redelivers it.

Each delivery gets a `process {queue}` span (kind CONSUMER) whose parent is the `traceparent`
the relay published, so the consumer joins the producing request's trace.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pika
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from outbox.amqp_codec import Properties, install_float_decoding
from outbox.consumer.policy import (
    ConsumerPolicy,
    DeadLetter,
    Requeue,
    RunAgain,
    dead_queue,
    decide,
    retry_queue,
)
from outbox.consumer.transactions import SessionTransactions, Transactions

log = logging.getLogger("outbox.consumer")

ATTEMPT_HEADER = "x-outbox-consumer-attempt"  # 1 on the first delivery, +1 per retry
ERROR_HEADER = "x-outbox-consumer-error"  # why the last attempt failed (retry and dead copies)
DEAD_AT_HEADER = "x-outbox-dead-at"
ORIGIN_HEADER = "x-outbox-origin"  # exchange/routing key the message first came from

_W3C = TraceContextTextMapPropagator()


@dataclass(frozen=True, slots=True)
class Message:
    """A delivery as a handler sees it.

    Attributes:
        id: The AMQP `message_id`: the id `outbox.enqueue` returned, the same on every retry
            and replay. The inbox deduplicates on it.
        exchange: The exchange the message was published to.
        routing_key: The routing key it was published with.
        body: The body, as sent.
        content_type: The AMQP content type, or None.
        headers: The AMQP headers; float values arrive as floats.
        attempt: 1 on the first delivery to this consumer, one more on each retry.
        redelivered: The broker delivered it before (it may or may not have been processed).
    """

    id: str
    exchange: str
    routing_key: str
    body: bytes
    content_type: str | None
    headers: Mapping[str, Any]  # float values arrive as floats (see Processor)
    attempt: int  # 1 on the first delivery to this consumer, +1 per retry
    redelivered: bool  # the broker delivered it before (it may or may not have been processed)

    def json(self) -> Any:
        """The body decoded as JSON (`json.loads`); raises `ValueError` if it is not JSON."""
        return json.loads(self.body)

    def text(self) -> str:
        """The body decoded as UTF-8 text; raises `UnicodeDecodeError` if it is not."""
        return self.body.decode("utf-8")


Handler = Callable[[Session, Message], None]


class BaseProcessor:
    """One delivery, with the database side handed in: `Processor` on a SQLAlchemy `Engine`,
    `outbox.django`'s on Django's connection. See `Processor` for what it does.

    Args:
        transactions: Where each delivery's transaction runs (`Transactions`).
        consumer: The consumer's name in the inbox.
        queue: The queue being consumed: it names the retry and dead-letter queues and the
            span.
        policy: Retries, backoff and dead-lettering (default: `ConsumerPolicy()`).
        tracer_provider: The OpenTelemetry tracer provider for the `process` spans (default:
            the global one).
    """

    def __init__(
        self,
        transactions: Transactions,
        *,
        consumer: str,
        queue: str,
        policy: ConsumerPolicy | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        install_float_decoding()
        self.transactions = transactions
        self.consumer = consumer
        self.queue = queue
        self.policy = policy or ConsumerPolicy()
        self._tracer = trace.get_tracer("outbox.consumer", tracer_provider=tracer_provider)
        self._publisher: Any = None  # a confirm-mode channel of the consuming connection
        self._declared: set[str] = set()
        self._paused_until = 0.0  # monotonic; deliveries go back untried until then
        self.counts: dict[str, int] = {}

    def __call__(self, channel: Any, method: Any, properties: Any, body: bytes) -> str:
        return self._run(channel, method, properties, body, 0)

    def _run(self, channel: Any, method: Any, properties: Any, body: bytes, conflicts: int) -> str:
        outcome = self._handle(channel, method, properties, body, conflicts)
        if outcome != "deferred":
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
        return outcome

    def _handle(
        self, channel: Any, method: Any, properties: Any, body: bytes, conflicts: int
    ) -> str:
        headers = dict(properties.headers or {})
        message = Message(
            id=properties.message_id or "",
            exchange=method.exchange,
            routing_key=method.routing_key,
            body=body,
            content_type=properties.content_type,
            headers=headers,
            attempt=_int(headers.get(ATTEMPT_HEADER), 1),
            redelivered=bool(method.redelivered),
        )
        parent = _W3C.extract({k: _text(v) for k, v in headers.items() if k in _W3C.fields})
        attributes = {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": self.queue,
            "messaging.rabbitmq.destination.routing_key": method.routing_key,
            "messaging.message.id": message.id,
            "messaging.consumer.group.name": self.consumer,
            "outbox.consumer.attempt": message.attempt,
            "outbox.consumer.conflicts": conflicts,
        }
        with self._tracer.start_as_current_span(
            f"process {self.queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            if not message.id:
                why = "the message has no message_id, so it cannot be deduplicated"
                return self._give_up(channel, method, properties, body, message, why, span)
            wait = self._paused_until - time.monotonic()
            if wait > 0:
                # The database was just found down: do not try it once per prefetched delivery.
                span.set_attribute("outbox.consumer.outcome", "requeued")
                self._requeue_later(channel, method.delivery_tag, wait)
                return "requeued"
            try:
                new = self.transactions.run(self.consumer, message)
            except Exception as exc:
                return self._failed(
                    channel, method, properties, body, message, exc, span, conflicts
                )
            channel.basic_ack(method.delivery_tag)
            outcome = "processed" if new else "duplicate"
            span.set_attribute("outbox.consumer.outcome", outcome)
            if not new:
                log.info(
                    "consumer.duplicate message_id=%s queue=%s", message.id, self.queue,
                    extra={"message_id": message.id, "queue": self.queue},
                )  # fmt: skip
            return outcome

    # ----------------------------------------------------------------- failures

    def _failed(
        self,
        channel: Any,
        method: Any,
        properties: Any,
        body: bytes,
        message: Message,
        exc: Exception,
        span: Any,
        conflicts: int,
    ) -> str:
        span.record_exception(exc)
        jitter = random.random()
        decision = decide(exc, message.attempt, self.policy, conflicts=conflicts, jitter=jitter)
        why = decision.why
        if isinstance(decision, Requeue):
            span.set_status(Status(StatusCode.ERROR, why))
            span.set_attribute("outbox.consumer.outcome", "requeued")
            log.warning(
                "consumer.database_unavailable message_id=%s queue=%s: %s",
                message.id, self.queue, why,
                extra={"message_id": message.id, "queue": self.queue, "error": why},
            )  # fmt: skip
            self._pause(channel, method.delivery_tag)  # back once the database may be
            return "requeued"
        if isinstance(decision, RunAgain):
            span.set_status(Status(StatusCode.ERROR, why))
            span.set_attribute("outbox.consumer.outcome", "deferred")
            in_s = round(decision.delay, 3)
            log.warning(
                "consumer.conflict message_id=%s queue=%s conflicts=%d in_s=%s: %s",
                message.id, self.queue, conflicts + 1, in_s, why,
                extra={"message_id": message.id, "queue": self.queue,
                       "conflicts": conflicts + 1, "in_s": in_s, "error": why},
            )  # fmt: skip

            def again() -> None:
                if channel.is_open:  # closed: the broker has already taken the delivery back
                    self._run(channel, method, properties, body, conflicts + 1)

            _call_later(channel, decision.delay, again)
            return "deferred"
        if isinstance(decision, DeadLetter):
            return self._give_up(channel, method, properties, body, message, why, span)
        delay = decision.delay
        arguments = {
            "x-message-ttl": delay * 1000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.queue,
        }
        extra = {ATTEMPT_HEADER: message.attempt + 1, ERROR_HEADER: why[:1000]}
        target = retry_queue(self.queue, delay)
        sent = self._forward(channel, method, properties, body, target, arguments, extra, span)
        if not sent:
            return "requeued"
        span.set_status(Status(StatusCode.ERROR, why))
        span.add_event("retry scheduled", {"delay_s": delay, "error": why[:1000]})
        span.set_attribute("outbox.consumer.outcome", "retried")
        log.warning(
            "consumer.retry message_id=%s queue=%s attempt=%d in_s=%d: %s",
            message.id, self.queue, message.attempt, delay, why,
            extra={"message_id": message.id, "queue": self.queue, "attempt": message.attempt,
                   "in_s": delay, "error": why},
        )  # fmt: skip
        return "retried"

    def _give_up(
        self,
        channel: Any,
        method: Any,
        properties: Any,
        body: bytes,
        message: Message,
        why: str,
        span: Any,
    ) -> str:
        extra = {
            ERROR_HEADER: why[:1000],
            DEAD_AT_HEADER: dt.datetime.now(dt.UTC).isoformat(),
            ORIGIN_HEADER: f"{method.exchange}/{method.routing_key}",
        }
        target = dead_queue(self.queue)
        if not self._forward(channel, method, properties, body, target, {}, extra, span):
            return "requeued"
        span.set_status(Status(StatusCode.ERROR, why))
        span.add_event("dead-lettered", {"reason": why[:1000]})
        span.set_attribute("outbox.consumer.outcome", "dead")
        log.error(
            "consumer.dead_lettered message_id=%s queue=%s: %s", message.id, self.queue, why,
            extra={"message_id": message.id, "queue": self.queue, "reason": why},
        )  # fmt: skip
        return "dead"

    def _forward(
        self,
        channel: Any,
        method: Any,
        properties: Any,
        body: bytes,
        target: str,
        arguments: Mapping[str, Any],
        extra_headers: Mapping[str, Any],
        span: Any,
    ) -> bool:
        """Publish a copy to `target` (confirmed), then ack the original; on failure requeue it."""
        try:
            publisher = self._publishing_channel(channel)
            if target not in self._declared:
                publisher.queue_declare(target, durable=True, arguments=dict(arguments))
                self._declared.add(target)
            headers = {**(properties.headers or {}), **extra_headers}
            # Properties, not pika's: the copy carries the original's float headers back out.
            copy = Properties(
                content_type=properties.content_type,
                content_encoding=properties.content_encoding,
                headers=headers,
                delivery_mode=pika.DeliveryMode.Persistent,
                message_id=properties.message_id,
                timestamp=properties.timestamp,
                correlation_id=properties.correlation_id,
                type=properties.type,
            )
            publisher.basic_publish("", target, body, copy, mandatory=True)
        except Exception as exc:
            span.record_exception(exc)
            log.error(
                "consumer.forward_failed message_id=%s queue=%s target=%s: %r",
                properties.message_id, self.queue, target, exc,
                extra={"message_id": properties.message_id, "queue": self.queue,
                       "target": target, "error": repr(exc)},
            )  # fmt: skip
            self._publisher = None
            self._declared.clear()
            self._pause(channel, method.delivery_tag)
            return False
        channel.basic_ack(method.delivery_tag)
        return True

    def _pause(self, channel: Any, delivery_tag: int) -> None:
        """Put the delivery back after `db_unavailable_delay`, and the deliveries that arrive
        meanwhile too, untried: what failed (the database, the broker) may be back by then."""
        delay = self.policy.db_unavailable_delay
        self._paused_until = time.monotonic() + delay
        self._requeue_later(channel, delivery_tag, delay)

    def _requeue_later(self, channel: Any, delivery_tag: int, delay: float) -> None:
        def nack() -> None:
            if channel.is_open:  # closed: the broker has already taken the delivery back
                channel.basic_nack(delivery_tag, requeue=True)

        _call_later(channel, delay, nack)

    def _publishing_channel(self, channel: Any) -> Any:
        if self._publisher is None or not self._publisher.is_open:
            self._publisher = channel.connection.channel()
            self._publisher.confirm_delivery()
            self._declared.clear()
        return self._publisher


class Processor(BaseProcessor):
    """One delivery: dedupe, run the handler in a transaction, then ack, retry or dead-letter.

    A pika `on_message_callback` (channel, method, properties, body); acknowledges by itself, so
    consume with manual acks. Returns what it did: processed, duplicate, retried, dead, requeued,
    or deferred (the handler's transaction lost a race and runs again shortly, on the connection's
    thread; `counts` records the outcome once it is known).

        process = outbox.Processor(engine, on_order, consumer="billing", queue="billing.orders")
        channel.basic_consume("billing.orders", process)   # manual acks: Processor acks

    Float headers: pika by itself decodes an AMQP double (how the relay sends a float header) as
    a truncated integer. Constructing a Processor makes pika decode them as floats, in the whole
    process and from then on (`outbox.amqp_codec.install_float_decoding`); values of every other
    type decode as pika decodes them. Done here, before the first delivery, so every message
    handled sees the same values; a process that never builds a Processor keeps pika's decoder
    unchanged.

    Args:
        engine: The application's SQLAlchemy `Engine`; each delivery gets a `Session` of it.
        handler: `handler(session, message)`, called inside the transaction (see `Consumer`).
        consumer: The consumer's name in the inbox.
        queue: The queue being consumed: it names the retry and dead-letter queues and the
            span.
        policy: Retries, backoff and dead-lettering (default: `ConsumerPolicy()`).
        tracer_provider: The OpenTelemetry tracer provider for the `process` spans (default:
            the global one).
    """

    def __init__(
        self,
        engine: Engine,
        handler: Handler,
        *,
        consumer: str,
        queue: str,
        policy: ConsumerPolicy | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        super().__init__(
            SessionTransactions(engine, handler),
            consumer=consumer,
            queue=queue,
            policy=policy,
            tracer_provider=tracer_provider,
        )
        self.engine = engine
        self.handler = handler


def _call_later(channel: Any, delay: float, callback: Callable[[], None]) -> None:
    """Run `callback` on the connection's own thread after `delay` seconds, without blocking it."""
    connection = channel.connection
    if hasattr(connection, "call_later"):  # BlockingConnection
        connection.call_later(delay, callback)
    else:  # the asynchronous adapters schedule on their IO loop
        connection.ioloop.call_later(delay, callback)


def _int(value: Any, default: int) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return default


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
