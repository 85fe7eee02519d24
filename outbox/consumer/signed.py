"""A consumer's signature check: a delivery reaches the Processor only once its signature verifies.

What does not verify (no signature, a bad one, a `webhook-id` other than the message id) goes to
`<queue>.dead` at once with the reason in its headers, and is counted: in the processor's counts
as `bad_signature`, and in the `outbox.consumer.bad_signatures` metric. It never reaches the inbox
or the handler: a forged message must not run code, nor take the id of a real one.

The webhook-id check matters because the signature covers that id, not the AMQP message_id the
inbox deduplicates on: without it, a genuine message copied under a new message_id would run its
handler again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics

from outbox.amqp_codec import Properties
from outbox.consumer.policy import dead_queue
from outbox.consumer.processor import DEAD_AT_HEADER, ERROR_HEADER, ORIGIN_HEADER, BaseProcessor
from outbox.signing import BadSignature, signer

log = logging.getLogger("outbox.consumer")

OUTCOME = "bad_signature"  # its key in Processor.counts
PERSISTENT = 2
# Seconds before a delivery whose dead-letter copy could not be sent goes back to the queue.
RETRY_FORWARD_AFTER = 5.0

_refused = metrics.get_meter("outbox.consumer").create_counter(
    "outbox.consumer.bad_signatures",
    unit="{message}",
    description="Deliveries dead-lettered because their signature did not verify",
)


class Verified:
    """A pika `on_message_callback`: verify, then hand the delivery to `processor`."""

    def __init__(
        self, processor: BaseProcessor, secrets: str | Sequence[str], *, max_age: float | None
    ) -> None:
        self.processor = processor
        self._signer = signer(secrets)  # InvalidSecret now, not on the first delivery
        self._max_age = max_age
        self._publisher: Any = None  # a confirm-mode channel of the consuming connection

    def __call__(self, channel: Any, method: Any, properties: Any, body: bytes) -> str:
        try:
            signed_id = self._signer.verify(body, properties.headers or {}, max_age=self._max_age)
            if signed_id != properties.message_id:
                raise BadSignature("the signed webhook-id is not the message_id")
        except BadSignature as exc:
            return self._refuse(channel, method, properties, body, f"bad signature: {exc}")
        return self.processor(channel, method, properties, body)

    def _refuse(self, channel: Any, method: Any, properties: Any, body: bytes, why: str) -> str:
        queue = self.processor.queue
        target = dead_queue(queue)
        headers = {
            **(properties.headers or {}),
            ERROR_HEADER: why[:1000],
            DEAD_AT_HEADER: dt.datetime.now(dt.UTC).isoformat(),
            ORIGIN_HEADER: f"{method.exchange}/{method.routing_key}",
        }
        copy = Properties(  # the original's properties and body, for whoever looks into it
            content_type=properties.content_type,
            content_encoding=properties.content_encoding,
            headers=headers,
            delivery_mode=PERSISTENT,
            message_id=properties.message_id,
            timestamp=properties.timestamp,
            correlation_id=properties.correlation_id,
            type=properties.type,
        )
        try:
            if self._publisher is None or not self._publisher.is_open:
                self._publisher = channel.connection.channel()
                self._publisher.confirm_delivery()
                self._publisher.queue_declare(target, durable=True)
            self._publisher.basic_publish("", target, body, copy, mandatory=True)
        except Exception as exc:
            # The copy is not safely kept: the delivery goes back, later, and is checked again.
            log.error(
                "consumer.forward_failed message_id=%s queue=%s target=%s: %r",
                properties.message_id, queue, target, exc,
                extra={"message_id": properties.message_id, "queue": queue, "target": target,
                       "error": repr(exc)},
            )  # fmt: skip
            self._publisher = None
            _later(channel, lambda: channel.basic_nack(method.delivery_tag, requeue=True))
            return "requeued"
        channel.basic_ack(method.delivery_tag)
        counts = self.processor.counts
        counts[OUTCOME] = counts.get(OUTCOME, 0) + 1
        _refused.add(1, {"messaging.destination.name": queue})
        log.error(
            "consumer.bad_signature message_id=%s queue=%s: %s", properties.message_id, queue, why,
            extra={"message_id": properties.message_id, "queue": queue, "reason": why},
        )  # fmt: skip
        return OUTCOME


def _later(channel: Any, callback: Any) -> None:
    def run() -> None:
        if channel.is_open:  # closed: the broker has already taken the delivery back
            callback()

    connection = channel.connection
    if hasattr(connection, "call_later"):  # BlockingConnection
        connection.call_later(RETRY_FORWARD_AFTER, run)
    else:  # the asynchronous adapters schedule on their IO loop
        connection.ioloop.call_later(RETRY_FORWARD_AFTER, run)
