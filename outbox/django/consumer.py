"""A consumer whose handler writes with Django's ORM: `handler(message)` runs inside
`transaction.atomic(using=...)` on Django's own connection, with the inbox row in that block.

    def on_order(message: outbox.Message) -> None:
        Invoice.objects.create(order_id=message.json()["id"])

    outbox.django.Consumer("billing.orders", on_order).run()   # or: manage.py outbox_consume

The handler's ORM writes and the message id's inbox row commit together or not at all, so a
redelivery of a committed message is skipped and a failed one leaves nothing behind: the
handler's writes happen once per message. Everything else (ack after commit, retries,
dead-letters, signatures, partitions, a graceful stop) is `outbox.Consumer`'s own loop
(`ConsumerLoop`), with this module's `DjangoTransactions` as its database.
"""

from __future__ import annotations

import datetime as dt
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from django.conf import settings  # type: ignore[import-untyped]
from django.db import connections, transaction  # type: ignore[import-untyped]
from opentelemetry.trace import TracerProvider

from outbox.consumer.consumer import ConsumerLoop
from outbox.consumer.inbox import purge_batches
from outbox.consumer.policy import ConsumerPolicy
from outbox.consumer.processor import BaseProcessor, Message
from outbox.django import process_once
from outbox.django.connection import lent
from outbox.errors import InvalidOption

Handler = Callable[[Message], None]

# The relay's default (`outbox-relay --amqp`): a broker on this machine.
DEFAULT_AMQP_URL = "amqp://guest:guest@localhost:5672/%2F"


def broker_url(amqp_url: str | None = None) -> str:
    """`amqp_url`, else `settings.OUTBOX_AMQP_URL`, else the environment's `OUTBOX_AMQP_URL`,
    else a broker on this machine, as for the relay."""
    return (
        amqp_url
        or getattr(settings, "OUTBOX_AMQP_URL", None)
        or os.environ.get("OUTBOX_AMQP_URL")
        or DEFAULT_AMQP_URL
    )


class DjangoTransactions:
    """Each delivery in `transaction.atomic(using=...)` on Django's connection of the consuming
    thread: the inbox row (`outbox.django.process_once`), then `handler(message)`.

    The connection is handled as for a request: before and after each delivery Django closes it
    when it is older than `CONN_MAX_AGE` (0, the default: every delivery opens one; set it to
    keep one open), or unusable after an error (`CONN_HEALTH_CHECKS` applies too).
    """

    def __init__(self, using: str, handler: Handler) -> None:
        self.using = using
        self.handler = handler

    def run(self, consumer: str, message: Message) -> bool:
        wrapper = connections[self.using]
        wrapper.close_if_unusable_or_obsolete()
        try:
            # durable: the outermost block, so its end is the commit the ack waits for.
            with transaction.atomic(using=self.using, durable=True):
                new = process_once(consumer=consumer, message_id=message.id, using=self.using)
                if new:
                    self.handler(message)
        finally:
            # A database error marked the connection for a check (Django's cursor, or
            # outbox/django/errors.py for the inbox row); a handler's Retry or Reject does not.
            wrapper.close_if_unusable_or_obsolete()
        return new

    def purge(self, consumer: str, *, cutoff: dt.datetime, batch_size: int) -> Iterator[int]:
        # On the purge thread, with a Django connection of its own, closed after each purge.
        wrapper = connections[self.using]
        try:
            with lent(wrapper) as conn:
                batches = purge_batches(
                    conn, consumer=consumer, cutoff=cutoff, batch_size=batch_size
                )
                while True:
                    with transaction.atomic(using=self.using):  # each batch commits alone
                        deleted = next(batches, None)
                    if deleted is None:
                        return
                    yield deleted
        finally:
            wrapper.close()


@dataclass
class Consumer:
    """Consume `queue`, running `handler(message)` once per message id inside
    `transaction.atomic(using=...)` on Django's connection, until `stop()`.

    Each delivery opens an atomic block, records the message id in the inbox (`outbox_inbox`,
    made by the app's migrations), runs the handler when the id is new, and commits; the
    delivery is acknowledged after the commit. A handler that raises rolls back its writes and
    the inbox row, and the message is retried through `<queue>.retry.<N>s` or dead-lettered to
    `<queue>.dead`, as `policy` decides; Django's database errors are told apart as SQLAlchemy's
    are (a lost connection puts the delivery back untried, a deadlock runs it again). `run()`
    blocks, on the thread that calls it (whose Django connection the handler uses); call
    `stop()` from a signal handler or another thread. `manage.py outbox_consume` runs one.

    Args:
        queue: The queue to consume.
        handler: `handler(message)` with an `outbox.Message`, called inside the atomic block.
            Raise `outbox.Retry` to try again later, `outbox.Reject` to dead-letter the
            message; any other exception counts as a failed attempt.
        using: The database alias, as in `transaction.atomic(using=...)`.
        amqp_url: The broker's URL, or a cluster's nodes separated by commas. None:
            `settings.OUTBOX_AMQP_URL`, else the environment's `OUTBOX_AMQP_URL`, else
            `amqp://guest:guest@localhost:5672/%2F`.
        name: As for `outbox.Consumer` (the inbox name; default: `queue`).
        prefetch: As for `outbox.Consumer`.
        policy: As for `outbox.Consumer`.
        tracer_provider: As for `outbox.Consumer`.
        inbox_retention: As for `outbox.Consumer`; the purge runs on a thread with a Django
            connection of its own.
        retention_interval: As for `outbox.Consumer`.
        purge_batch_size: As for `outbox.Consumer`.
        ssl_options: As for `outbox.Consumer` (a `pika.SSLOptions`).
        signing_secrets: As for `outbox.Consumer`.
        signature_max_age: As for `outbox.Consumer`.
        partitions: As for `outbox.Consumer`.

    Raises:
        InvalidOption: `handler` is not a callable that takes one argument, or an option is
            out of range.
        django.db.utils.ConnectionDoesNotExist: `using` is not in `DATABASES`.
    """

    queue: str
    handler: Handler
    _: KW_ONLY
    using: str = "default"
    amqp_url: str | None = None
    name: str | None = None
    prefetch: int = 50
    policy: ConsumerPolicy = field(default_factory=ConsumerPolicy)
    tracer_provider: TracerProvider | None = None
    inbox_retention: dt.timedelta | None = dt.timedelta(days=7)
    retention_interval: float = 600.0
    purge_batch_size: int = 1000
    ssl_options: Any = None  # a pika.SSLOptions (pika is the consumer package's to import)
    signing_secrets: str | Sequence[str] | None = None
    signature_max_age: float | None = None
    partitions: int | None = None

    def __post_init__(self) -> None:
        check_handler(self.handler)
        connections[self.using]  # an alias DATABASES does not have fails here
        self.amqp_url = broker_url(self.amqp_url)
        self.loop = ConsumerLoop(
            DjangoTransactions(self.using, self.handler),
            self.amqp_url,
            self.queue,
            name=self.name,
            prefetch=self.prefetch,
            policy=self.policy,
            tracer_provider=self.tracer_provider,
            inbox_retention=self.inbox_retention,
            retention_interval=self.retention_interval,
            purge_batch_size=self.purge_batch_size,
            ssl_options=self.ssl_options,
            signing_secrets=self.signing_secrets,
            signature_max_age=self.signature_max_age,
            partitions=self.partitions,
        )
        self.queues: list[str] = self.loop.queues
        self.processors: list[BaseProcessor] = self.loop.processors
        self.processor: BaseProcessor = self.loop.processor
        self.ready = self.loop.ready  # set once consuming has started

    def run(self) -> None:
        """Consume until `stop()`; the delivery being handled finishes, the rest are requeued.
        The broker's connection errors propagate (`outbox.consumer.consumer.BrokerError`)."""
        try:
            self.loop.run()
        finally:
            connections[self.using].close()  # this thread's, kept open by CONN_MAX_AGE

    def stop(self) -> None:
        """Ask `run()` to return after the delivery in hand. Safe from any thread and from a
        signal handler."""
        self.loop.stop()


def check_handler(handler: object) -> None:
    """InvalidOption unless `handler` can be called with one argument, the message (a
    `(session, message)` handler of `outbox.Consumer` cannot)."""
    if not callable(handler):
        raise InvalidOption(f"the handler must be callable, not {type(handler).__name__}")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    try:
        signature.bind(None)
    except TypeError:
        names = ", ".join(signature.parameters)
        raise InvalidOption(
            f"the handler is called as handler(message), but its parameters are ({names})"
        ) from None
