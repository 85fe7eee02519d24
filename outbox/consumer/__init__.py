"""Applications consume what the relay published: a consumer, its handler outcomes, and the inbox
that makes at-least-once delivery effectively-once.

    consumer.py    the connection and the consuming loop (`Consumer`)
    processor.py   one delivery: inbox, the handler's transaction, ack, retry or dead-letter copy
    policy.py      what a handler's failure leads to (pure): `Retry`, `Reject`, `ConsumerPolicy`
    inbox.py       `process_once` (and `_async`), `purge_inbox`: deduplication by message id
    signed.py      with `signing_secrets`: a delivery's signature checked before the processor

The inbox and the handler outcomes (`process_once`, `purge_inbox`, `Retry`, `Reject`, ...) need
SQLAlchemy alone, for applications that consume with a library of their own (Celery, FastStream,
a pika loop); the consumer and processor import pika (the relay extra) when first named here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from outbox.consumer.inbox import process_once, process_once_async, purge_inbox
from outbox.consumer.policy import ConsumerPolicy, Reject, Retry, dead_queue, retry_queue

if TYPE_CHECKING:
    from outbox.consumer.consumer import Consumer
    from outbox.consumer.processor import (
        ATTEMPT_HEADER,
        DEAD_AT_HEADER,
        ERROR_HEADER,
        ORIGIN_HEADER,
        Handler,
        Message,
        Processor,
    )

# Name -> the module that holds it: those import pika, loaded when the name is first looked up.
_LAZY = {
    "Consumer": "outbox.consumer.consumer",
    **dict.fromkeys(
        ("ATTEMPT_HEADER", "DEAD_AT_HEADER", "ERROR_HEADER", "ORIGIN_HEADER", "Handler",
         "Message", "Processor"),
        "outbox.consumer.processor",
    ),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox.consumer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


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
