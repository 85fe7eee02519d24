"""A RabbitMQ consumer that runs each message's handler once, inside the application's transaction.

    def on_order(session: Session, message: outbox.Message) -> None:
        session.add(Invoice(order_id=message.json()["id"]))

    consumer = outbox.Consumer(engine, amqp_url, "billing.orders", on_order)
    consumer.run()                      # until consumer.stop() (from a signal handler or thread)

For each delivery: the handler runs in a transaction together with an inbox record keyed by the
message id (outbox/consumer/inbox.py), so a redelivered or duplicated message is recognised and acknowledged
without running the handler again; the delivery is acknowledged only after that transaction
commits. A handler that raises is retried through the broker with growing delays (the message goes
to `<queue>.retry.<N>s`, a queue whose TTL sends it back after N seconds), or dead-lettered to
`<queue>.dead` with the reason in its headers: at once for `Reject` or a configured permanent
exception, after `max_attempts` otherwise. The retry or dead copy is confirmed by the broker before
the original is acknowledged, so a crash in between duplicates a message (the inbox absorbs it)
but never loses one.

The handling of one delivery is `Processor`, usable from any plain pika consumer loop:

    process = outbox.Processor(engine, on_order, consumer="billing", queue="billing.orders")
    channel.basic_consume("billing.orders", process)   # manual acks: Processor acks

Each delivery gets a `process {queue}` span (kind CONSUMER) whose parent is the `traceparent`
the relay published, so the consumer joins the producing request's trace.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pika
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from outbox.consumer.inbox import process_once, purge_inbox

log = logging.getLogger("outbox.consumer")

ATTEMPT_HEADER = "x-outbox-consumer-attempt"  # 1 on the first delivery, +1 per retry
ERROR_HEADER = "x-outbox-consumer-error"  # why the last attempt failed (retry and dead copies)
DEAD_AT_HEADER = "x-outbox-dead-at"
ORIGIN_HEADER = "x-outbox-origin"  # exchange/routing key the message first came from

_W3C = TraceContextTextMapPropagator()


class Retry(Exception):
    """Raise from a handler to try the message again later (after `delay` seconds if given)."""

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Reject(Exception):
    """Raise from a handler to dead-letter the message now: retrying cannot help."""


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    exchange: str
    routing_key: str
    body: bytes
    content_type: str | None
    headers: Mapping[str, Any]
    attempt: int  # 1 on the first delivery to this consumer, +1 per retry
    redelivered: bool  # the broker delivered it before (it may or may not have been processed)

    def json(self) -> Any:
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8")


@dataclass(frozen=True, slots=True)
class ConsumerPolicy:
    max_attempts: int = 5  # handler runs before a failing message is dead-lettered
    backoff_base: float = 1.0  # first retry delay, seconds; doubles per attempt
    backoff_cap: float = 300.0  # longest retry delay
    permanent: tuple[type[BaseException], ...] = ()  # exception types dead-lettered at once
    db_unavailable_delay: float = 1.0  # pause before requeueing when the database is down

    def delay(self, attempt: int) -> int:
        """Seconds before retry number `attempt` (see `delay_tier`)."""
        return delay_tier(min(self.backoff_cap, self.backoff_base * 2 ** max(0, attempt - 1)))


def delay_tier(seconds: float) -> int:
    """A delay rounded up to a power of two seconds: each is a retry queue of its own, because
    RabbitMQ expires per-message TTLs only at the head of a queue (a long delay would hold up a
    short one behind it), while a queue-wide TTL expires every message on time."""
    return int(2 ** math.ceil(math.log2(max(1.0, seconds))))


def retry_queue(queue: str, delay: int) -> str:
    return f"{queue}.retry.{delay}s"


def dead_queue(queue: str) -> str:
    return f"{queue}.dead"


Handler = Callable[[Session, Message], None]


class Processor:
    """One delivery: dedupe, run the handler in a transaction, then ack, retry or dead-letter.

    A pika `on_message_callback` (channel, method, properties, body); acknowledges by itself, so
    consume with manual acks. Returns what it did: processed, duplicate, retried, dead, requeued.
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
        self.engine = engine
        self.handler = handler
        self.consumer = consumer
        self.queue = queue
        self.policy = policy or ConsumerPolicy()
        self._tracer = trace.get_tracer("outbox.consumer", tracer_provider=tracer_provider)
        self._publisher: Any = None  # a confirm-mode channel of the consuming connection
        self._declared: set[str] = set()
        self.counts: dict[str, int] = {}

    def __call__(self, channel: Any, method: Any, properties: Any, body: bytes) -> str:
        outcome = self._handle(channel, method, properties, body)
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        return outcome

    def _handle(self, channel: Any, method: Any, properties: Any, body: bytes) -> str:
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
        }
        with self._tracer.start_as_current_span(
            f"process {self.queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            if not message.id:
                why = "the message has no message_id, so it cannot be deduplicated"
                return self._give_up(channel, method, properties, body, message, why, span)
            try:
                with Session(self.engine) as session, session.begin():
                    new = process_once(session, consumer=self.consumer, message_id=message.id)
                    if new:
                        self.handler(session, message)
            except Exception as exc:
                return self._failed(channel, method, properties, body, message, exc, span)
            channel.basic_ack(method.delivery_tag)
            outcome = "processed" if new else "duplicate"
            span.set_attribute("outbox.consumer.outcome", outcome)
            if not new:
                log.info("consumer.duplicate", extra={"message_id": message.id})
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
    ) -> str:
        span.record_exception(exc)
        why = f"{type(exc).__name__}: {exc}"
        if _database_unavailable(exc):
            # Not the message's fault: put it back, unchanged, once the database may be back.
            span.set_status(Status(StatusCode.ERROR, why))
            span.set_attribute("outbox.consumer.outcome", "requeued")
            log.warning("consumer.database_unavailable", extra={"error": why})
            time.sleep(self.policy.db_unavailable_delay)
            channel.basic_nack(method.delivery_tag, requeue=True)
            return "requeued"
        permanent = isinstance(exc, (Reject, *self.policy.permanent))
        if permanent or message.attempt >= self.policy.max_attempts:
            if not permanent:
                why = f"gave up after {message.attempt} attempts: {why}"
            return self._give_up(channel, method, properties, body, message, why, span)
        delay = self.policy.delay(message.attempt)
        if isinstance(exc, Retry) and exc.delay is not None:
            delay = delay_tier(exc.delay)
        target = retry_queue(self.queue, delay)
        arguments = {
            "x-message-ttl": delay * 1000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.queue,
        }
        extra = {ATTEMPT_HEADER: message.attempt + 1, ERROR_HEADER: why[:1000]}
        sent = self._forward(channel, method, properties, body, target, arguments, extra, span)
        if not sent:
            return "requeued"
        span.set_status(Status(StatusCode.ERROR, why))
        span.add_event("retry scheduled", {"delay_s": delay, "error": why[:1000]})
        span.set_attribute("outbox.consumer.outcome", "retried")
        log.warning(
            "consumer.retry",
            extra={"message_id": message.id, "attempt": message.attempt, "in_s": delay,
                   "error": why},
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
        log.error("consumer.dead_lettered", extra={"message_id": message.id, "reason": why})
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
            copy = pika.BasicProperties(
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
            log.error("consumer.forward_failed", extra={"target": target, "error": repr(exc)})
            self._publisher = None
            self._declared.clear()
            time.sleep(self.policy.db_unavailable_delay)
            channel.basic_nack(method.delivery_tag, requeue=True)
            return False
        channel.basic_ack(method.delivery_tag)
        return True

    def _publishing_channel(self, channel: Any) -> Any:
        if self._publisher is None or not self._publisher.is_open:
            self._publisher = channel.connection.channel()
            self._publisher.confirm_delivery()
            self._declared.clear()
        return self._publisher


@dataclass
class Consumer:
    """Consume `queue` with a `Processor` until `stop()`: prefetch, graceful stop, inbox retention.

    `name` (default: the queue) keys the inbox: two consumers with different names each process
    every message once; instances with the same name share the work and the deduplication.
    """

    engine: Engine
    amqp_url: str
    queue: str
    handler: Handler
    name: str | None = None
    prefetch: int = 50
    policy: ConsumerPolicy = field(default_factory=ConsumerPolicy)
    tracer_provider: TracerProvider | None = None
    inbox_retention: dt.timedelta | None = dt.timedelta(days=7)
    retention_interval: float = 600.0

    def __post_init__(self) -> None:
        self.processor = Processor(
            self.engine,
            self.handler,
            consumer=self.name or self.queue,
            queue=self.queue,
            policy=self.policy,
            tracer_provider=self.tracer_provider,
        )
        self._lock = threading.Lock()
        self._conn: Any = None
        self._channel: Any = None
        self._stop = False
        self.ready = threading.Event()  # set once consuming has started

    def run(self) -> None:
        """Consume until `stop()`; the delivery being handled finishes, the rest are requeued."""
        params = pika.URLParameters(self.amqp_url)
        conn = pika.BlockingConnection(params)
        try:
            channel = conn.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            channel.basic_consume(self.queue, self.processor)
            with self._lock:
                self._conn, self._channel = conn, channel
                stop = self._stop
            if self.inbox_retention is not None:
                self._purge()
            self.ready.set()
            if not stop:
                channel.start_consuming()
        finally:
            with self._lock:
                self._conn = self._channel = None
            if conn.is_open:
                conn.close()

    def stop(self) -> None:
        """Ask `run()` to return after the delivery in hand. Safe from any thread."""
        with self._lock:
            self._stop = True
            if self._conn is not None:
                self._conn.add_callback_threadsafe(self._channel.stop_consuming)

    def _purge(self) -> None:
        assert self.inbox_retention is not None
        try:
            deleted = purge_inbox(self.engine, older_than=self.inbox_retention)
            if deleted:
                log.info("consumer.inbox_purged", extra={"deleted": deleted})
        except DBAPIError as exc:
            log.warning("consumer.inbox_purge_failed", extra={"error": str(exc.orig)})
        if self._conn is not None:
            self._conn.call_later(self.retention_interval, self._purge)


def _database_unavailable(exc: BaseException) -> bool:
    """The database failed (connection lost, shutting down), not the handler: told apart by
    SQLSTATE exactly as the relay does; SQLite's OperationalError (locked, I/O) counts too."""
    # Imported here: `import outbox` must not import the relay package (which imports outbox).
    from relay.core.failures import DbFailure, classify_db_error

    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is None:
        return isinstance(exc, OperationalError)
    return classify_db_error(sqlstate) is DbFailure.TRANSIENT


def _int(value: Any, default: int) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return default


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
