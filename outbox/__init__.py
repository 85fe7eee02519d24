"""outbox: write messages in your own database transaction; `outbox-relay` publishes them.

import outbox
with Session(engine) as session, session.begin():
    session.add(order)
    outbox.enqueue(session, exchange="orders", routing_key="order.created",
                   payload={"id": order.id}, key=str(order.id))
"""

from outbox.config import configure
from outbox.consumer.consumer import Consumer, ConsumerPolicy, Message, Processor, Reject, Retry
from outbox.consumer.inbox import process_once, purge_inbox
from outbox.enqueue import enqueue
from outbox.errors import (
    IdempotencyConflict,
    InvalidDestination,
    InvalidHeader,
    InvalidMessage,
    InvalidOption,
    OutboxError,
    PayloadEncodingError,
    PayloadTooLarge,
    SchemaMissing,
)
from outbox.schema import create_schema
from outbox.states import State

__all__ = [
    "Consumer",
    "ConsumerPolicy",
    "IdempotencyConflict",
    "InvalidDestination",
    "InvalidHeader",
    "InvalidMessage",
    "InvalidOption",
    "Message",
    "OutboxError",
    "PayloadEncodingError",
    "PayloadTooLarge",
    "Processor",
    "Reject",
    "Retry",
    "SchemaMissing",
    "State",
    "configure",
    "create_schema",
    "enqueue",
    "process_once",
    "purge_inbox",
]
