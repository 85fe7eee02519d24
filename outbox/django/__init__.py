"""outbox for Django: enqueue on Django's own connection, inside `transaction.atomic()`.

    INSTALLED_APPS = [..., "outbox.django"]      # its migrations create the outbox tables

    from django.db import transaction
    import outbox.django

    with transaction.atomic():
        order = Order.objects.create(total=5)
        outbox.django.enqueue(exchange="orders", routing_key="order.created",
                              payload={"id": order.id}, key=str(order.id))

The message is one INSERT in the transaction Django has open, on the connection Django's ORM
uses (`django.db.connections[using]`): an atomic block or savepoint that rolls back takes it
with it. In logical capture mode on PostgreSQL (`OUTBOX_CAPTURE=logical`) it is a message in
that transaction's write-ahead log instead, which a rollback, of the block or of a savepoint,
takes with it just the same. Outside any atomic block Django autocommits, so the call is refused
(`outbox.NotInTransaction`) rather than commit a message on its own. `process_once` (the inbox)
and the test helpers (`enqueued`, `assert_enqueued`, `assert_not_enqueued`) work on the same
connection (the helpers read the table: in logical mode on PostgreSQL they raise). PostgreSQL
(psycopg 3 or psycopg2), SQLite and MySQL/MariaDB (through PyMySQL).

Consuming: `outbox.django.Consumer(queue, handler)` runs `handler(message)` inside
`transaction.atomic()` on the same connection, with the inbox row written in that block, so the
handler's ORM writes happen once per message; `python manage.py outbox_consume QUEUE --handler
dotted.path` runs one. `TransactionTestCase` and `manage.py flush` empty the outbox tables: the
app's models name them to Django (outbox/django/models.py).

Importing this module imports Django; `import outbox` never does, and the consumer (and pika)
is imported on the first use of `outbox.django.Consumer`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Unpack

from django.db import connections  # type: ignore[import-untyped]

import outbox
from outbox import testing
from outbox.django.connection import in_transaction, raw_connection
from outbox.django.errors import django_errors
from outbox.testing import EnqueuedMessage, Filters

if TYPE_CHECKING:  # what the lazy name resolves to, for type checkers and IDEs
    from outbox.django.consumer import Consumer

__all__ = [
    "Consumer",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueue",
    "enqueue_many",
    "enqueued",
    "process_once",
]


def enqueue(
    *,
    exchange: str,
    routing_key: str,
    payload: object,
    key: str | None = None,
    headers: Mapping[str, str | int | float | bool] | None = None,
    idempotency_key: str | None = None,
    delay: float | dt.timedelta | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    content_type: str | None = None,
    using: str = "default",
) -> uuid.UUID:
    """Add a message to the transaction Django has open on `using`; return its id.

    `outbox.enqueue` on Django's connection, with the same arguments, checks and errors. Call
    it inside `transaction.atomic()`: the message commits with the block, and a block or
    savepoint that rolls back drops it.

    Args:
        exchange: As for `outbox.enqueue`.
        routing_key: As for `outbox.enqueue`.
        payload: As for `outbox.enqueue`.
        key: As for `outbox.enqueue`.
        headers: As for `outbox.enqueue`.
        idempotency_key: As for `outbox.enqueue`.
        delay: As for `outbox.enqueue`.
        priority: As for `outbox.enqueue`.
        max_attempts: As for `outbox.enqueue`.
        content_type: As for `outbox.enqueue`.
        using: The database alias, as in `transaction.atomic(using=...)`.

    Returns:
        The message id, a UUIDv7, also the AMQP `message_id`.

    Raises:
        NotInTransaction: No atomic block is open on `using` (and autocommit is on): the
            message would commit on its own.
        InvalidMessage: An argument is invalid (see `outbox.enqueue`). Nothing is written.
        SchemaMissing: The outbox tables do not exist: run `manage.py migrate`.
        UnsupportedDatabase: Django's connection is not one the outbox takes.
        CaptureNotSetUp: Logical capture is on (see `outbox.configure`), and the database has
            no replication slot for the relay. Nothing is written.
        django.db.DatabaseError: The INSERT failed in the database (Django's exception of
            that kind, raised from SQLAlchemy's; on PostgreSQL, `InternalError` when an earlier
            statement of the block failed and its error was caught without a savepoint).
    """
    wrapper = connections[using]
    conn = in_transaction(wrapper, call="outbox.django.enqueue")
    with django_errors(wrapper, call="outbox.django.enqueue"):
        return outbox.enqueue(
            conn,
            exchange=exchange,
            routing_key=routing_key,
            payload=payload,
            key=key,
            headers=headers,
            idempotency_key=idempotency_key,
            delay=delay,
            priority=priority,
            max_attempts=max_attempts,
            content_type=content_type,
        )


def enqueue_many(
    messages: Iterable[Mapping[str, Any]], *, using: str = "default"
) -> list[uuid.UUID]:
    """`outbox.enqueue_many` on Django's connection, inside `transaction.atomic()`: many
    messages in a few statements, every item checked before anything is written; their ids, in
    the items' order.

    Raises:
        NotInTransaction: No atomic block is open on `using`.
        InvalidMessage: An item is invalid (its index named). Nothing is written.
        django.db.DatabaseError: An INSERT failed in the database (as for `enqueue`).
    """
    wrapper = connections[using]
    conn = in_transaction(wrapper, call="outbox.django.enqueue_many")
    with django_errors(wrapper, call="outbox.django.enqueue_many"):
        return outbox.enqueue_many(conn, messages)


def process_once(*, consumer: str, message_id: str, using: str = "default") -> bool:
    """`outbox.process_once` on Django's connection, inside `transaction.atomic()`: record
    `message_id` for `consumer` in the block that applies the message; False if it was already
    there (skip the message, acknowledge the delivery after the block).

    Raises:
        NotInTransaction: No atomic block is open on `using`.
        django.db.DatabaseError: The INSERT failed in the database (as for `enqueue`).
    """
    wrapper = connections[using]
    conn = in_transaction(wrapper, call="outbox.django.process_once")
    with django_errors(wrapper, call="outbox.django.process_once"):
        return outbox.process_once(conn, consumer=consumer, message_id=message_id)


def enqueued(*, using: str = "default", **filters: Unpack[Filters]) -> list[EnqueuedMessage]:
    """`outbox.testing.enqueued` on Django's connection: in a Django `TestCase`, the messages
    the test's transaction wrote (and any committed before it)."""
    return testing.enqueued(raw_connection(connections[using]), **filters)


def assert_enqueued(
    *, count: int | None = None, using: str = "default", **filters: Unpack[Filters]
) -> list[EnqueuedMessage]:
    """`outbox.testing.assert_enqueued` on Django's connection."""
    return testing.assert_enqueued(raw_connection(connections[using]), count=count, **filters)


def assert_not_enqueued(*, using: str = "default", **filters: Unpack[Filters]) -> None:
    """`outbox.testing.assert_not_enqueued` on Django's connection."""
    testing.assert_not_enqueued(raw_connection(connections[using]), **filters)


def __getattr__(name: str) -> Any:
    # The consumer imports pika, which a project that only enqueues never needs (PEP 562).
    if name == "Consumer":
        from outbox.django.consumer import Consumer

        globals()[name] = Consumer
        return Consumer
    raise AttributeError(f"module 'outbox.django' has no attribute {name!r}")
