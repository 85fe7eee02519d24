"""Applications consume what the relay published: a consumer, its handler outcomes, and the inbox
that makes at-least-once delivery effectively-once.

    consumer.py    the connection and the consuming loop (`Consumer`)
    processor.py   one delivery: inbox, the handler's transaction, ack, retry or dead-letter copy
    policy.py      what a handler's failure leads to (pure): `Retry`, `Reject`, `ConsumerPolicy`
    inbox.py       `process_once` (and `_async`), `purge_inbox`: deduplication by message id
    signed.py      with `signing_secrets`: a delivery's signature checked before the processor

Importing this package imports pika; `import outbox` does not, until a consumer name is used.
"""

from outbox.consumer.consumer import Consumer
from outbox.consumer.inbox import process_once, process_once_async, purge_inbox
from outbox.consumer.policy import ConsumerPolicy, Reject, Retry, dead_queue, retry_queue
from outbox.consumer.processor import (
    ATTEMPT_HEADER,
    DEAD_AT_HEADER,
    ERROR_HEADER,
    ORIGIN_HEADER,
    Handler,
    Message,
    Processor,
)

__all__ = [
    "ATTEMPT_HEADER",
    "DEAD_AT_HEADER",
    "ERROR_HEADER",
    "ORIGIN_HEADER",
    "Consumer",
    "ConsumerPolicy",
    "Handler",
    "Message",
    "Processor",
    "Reject",
    "Retry",
    "dead_queue",
    "process_once",
    "process_once_async",
    "purge_inbox",
    "retry_queue",
]
