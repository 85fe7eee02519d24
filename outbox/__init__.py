"""outbox: write messages in your own database transaction; `outbox-relay` publishes them.

import outbox
with Session(engine) as session, session.begin():
    session.add(order)
    outbox.enqueue(session, exchange="orders", routing_key="order.created",
                   payload={"id": order.id}, key=str(order.id))

`import outbox` loads neither pika nor the relay: an application that only enqueues pays for
neither. The consumer's names (`outbox.Consumer`, `outbox.Processor`, ...), `outbox.testing` and
`outbox.enqueue_async` (SQLAlchemy's asyncio extension) are imported on first use.
`pip install outbox-relay` installs what the rest needs (SQLAlchemy, the OpenTelemetry API); the
consumer's names need the relay extra (`pip install 'outbox-relay[relay]'`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from outbox.celery_task import celery_task_message
from outbox.config import configure
from outbox.dramatiq_task import dramatiq_message, dramatiq_message_with_options
from outbox.enqueue import enqueue
from outbox.errors import (
    CaptureNotSetUp,
    HeadersTooLarge,
    IdempotencyConflict,
    InvalidDestination,
    InvalidHeader,
    InvalidMessage,
    InvalidOption,
    InvalidSession,
    NotInTransaction,
    OutboxError,
    PayloadEncodingError,
    PayloadTooDeep,
    PayloadTooLarge,
    SchemaMissing,
    UnsupportedDatabase,
)
from outbox.many import enqueue_many
from outbox.schema import create_schema, metadata
from outbox.signing import BadSignature, verify
from outbox.states import State

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and IDEs
    import outbox.testing as testing
    from outbox.async_enqueue import enqueue_async, enqueue_many_async
    from outbox.consumer import (
        Consumer,
        ConsumerPolicy,
        Message,
        Processor,
        Reject,
        Retry,
        process_once,
        process_once_async,
        purge_inbox,
    )

# Name -> the module that holds it; imported when the name is first looked up (PEP 562). The
# consumer package imports pika, which an application that only enqueues never needs; the async
# enqueue imports SQLAlchemy's asyncio extension, which a sync application never needs.
_LAZY = {
    "enqueue_async": "outbox.async_enqueue",
    "enqueue_many_async": "outbox.async_enqueue",
    "Consumer": "outbox.consumer",
    "ConsumerPolicy": "outbox.consumer",
    "Message": "outbox.consumer",
    "Processor": "outbox.consumer",
    "Reject": "outbox.consumer",
    "Retry": "outbox.consumer",
    "process_once": "outbox.consumer",
    "process_once_async": "outbox.consumer",
    "purge_inbox": "outbox.consumer",
}


def __getattr__(name: str) -> Any:
    if name == "testing":
        return importlib.import_module("outbox.testing")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox' has no attribute {name!r}")
    try:  # a package may load the module holding `name` only when it is looked up
        value = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        named = _needs_extra(name, module, exc)
        if named is None:
            raise
        raise named from exc
    globals()[name] = value  # later lookups are plain attribute reads
    return value


# What `pip install outbox-relay` leaves out: pika and the rest of the relay extra for the
# consumer, greenlet (SQLAlchemy's asyncio extension) for the async enqueue.
_EXTRAS = {"outbox.consumer": "relay", "outbox.async_enqueue": "async"}


def _needs_extra(name: str, module: str, exc: ImportError) -> ImportError | None:
    """The error naming the extra to install when `module` failed for a missing dependency."""
    cause = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
    absent = getattr(cause, "name", None)
    extra = _EXTRAS.get(module)
    if extra is None or not absent or absent.startswith("outbox"):
        return None
    return ModuleNotFoundError(
        f"outbox.{name} needs the {extra} extra: pip install 'outbox-relay[{extra}]' "
        f"({absent} is not installed)",
        name=absent,
    )


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "testing"})


__all__ = [
    "BadSignature",
    "CaptureNotSetUp",
    "Consumer",
    "ConsumerPolicy",
    "HeadersTooLarge",
    "IdempotencyConflict",
    "InvalidDestination",
    "InvalidHeader",
    "InvalidMessage",
    "InvalidOption",
    "InvalidSession",
    "Message",
    "NotInTransaction",
    "OutboxError",
    "PayloadEncodingError",
    "PayloadTooDeep",
    "PayloadTooLarge",
    "Processor",
    "Reject",
    "Retry",
    "SchemaMissing",
    "State",
    "UnsupportedDatabase",
    "celery_task_message",
    "configure",
    "create_schema",
    "dramatiq_message",
    "dramatiq_message_with_options",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "metadata",
    "process_once",
    "process_once_async",
    "purge_inbox",
    "testing",
    "verify",
]
