"""A RabbitMQ consumer that runs each message's handler once, inside the application's transaction.

    def on_order(session: Session, message: outbox.Message) -> None:
        session.add(Invoice(order_id=message.json()["id"]))

    consumer = outbox.Consumer(engine, amqp_url, "billing.orders", on_order)
    consumer.run()                      # until consumer.stop() (from a signal handler or thread)

This module is the connection and the consuming loop (`ConsumerLoop`): prefetch, a graceful
stop, inbox retention (on a thread of its own, so a long purge never holds up pika's connection
thread, which must keep answering heartbeats). What happens to each delivery (dedupe, the
handler's transaction, retry and dead-letter copies) is `Processor`, in
outbox/consumer/processor.py; where the transaction runs is a `Transactions`
(outbox/consumer/transactions.py): a SQLAlchemy `Session` here, Django's connection in
`outbox.django.Consumer`.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika
from opentelemetry.trace import TracerProvider
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from outbox.consumer.policy import ConsumerPolicy
from outbox.consumer.processor import BaseProcessor, Handler
from outbox.consumer.signed import Verified
from outbox.consumer.transactions import SessionTransactions, Transactions
from outbox.errors import InvalidOption

log = logging.getLogger("outbox.consumer")

# What `run()` raises when the broker cannot be reached or drops the connection (pika's root
# exception), for callers that do not import pika themselves.
BrokerError = pika.exceptions.AMQPError

# A comma followed by a scheme starts the next URL of a list (the relay's --amqp reads lists
# the same way, in relay/core/urls.py; the library cannot import the relay).
_NEXT_URL = re.compile(r"[\s,]*,\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")


def connection_parameters(
    amqp_url: str, ssl_options: pika.SSLOptions | None = None
) -> list[pika.URLParameters]:
    """pika's parameters for each URL of `amqp_url` (one URL, or a cluster's nodes separated
    by commas), in order; `ssl_options` replaces pika's default TLS settings on amqps:// ones."""
    nodes = []
    for url in _NEXT_URL.split(amqp_url.strip().strip(",")):
        params = pika.URLParameters(url.strip())
        if ssl_options is not None and params.ssl_options is not None:
            params.ssl_options = ssl_options
        nodes.append(params)
    return nodes


def partition_queues(queue: str, partitions: int | None) -> list[str]:
    """The queues a consumer of `queue` reads: itself, or the partitions of a partitioned queue,
    named as `outbox-relay topology apply` declares them (relay/core/topology.py)."""
    if partitions is None:
        return [queue]
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise InvalidOption(f"partitions must be a positive integer, got {partitions!r}")
    return [f"{queue}.{i}" for i in range(partitions)]


class ConsumerLoop:
    """The connection and the consuming loop of a consumer, whatever its database: one
    `BaseProcessor` per queue consumed (behind a signature check with `signing_secrets`),
    prefetch, a graceful stop, and the inbox purge on a thread of its own. `Consumer` runs one
    with `SessionTransactions`; `outbox.django.Consumer` with Django's. The arguments are
    `Consumer`'s, with `transactions` in place of the engine and the handler.
    """

    def __init__(
        self,
        transactions: Transactions,
        amqp_url: str,
        queue: str,
        *,
        name: str | None = None,
        prefetch: int = 50,
        policy: ConsumerPolicy | None = None,
        tracer_provider: TracerProvider | None = None,
        inbox_retention: dt.timedelta | None = dt.timedelta(days=7),
        retention_interval: float = 600.0,
        purge_batch_size: int = 1000,
        ssl_options: pika.SSLOptions | None = None,
        signing_secrets: str | Sequence[str] | None = None,
        signature_max_age: float | None = None,
        partitions: int | None = None,
    ) -> None:
        self.transactions = transactions
        self.amqp_url = amqp_url
        self.prefetch = prefetch
        self.inbox_retention = inbox_retention
        self.retention_interval = retention_interval
        self.purge_batch_size = purge_batch_size
        self.ssl_options = ssl_options
        self.queues = partition_queues(queue, partitions)
        # One processor per queue consumed: a retried message goes back to its own partition.
        self.processors = [
            BaseProcessor(
                transactions,
                consumer=name or queue,
                queue=q,
                policy=policy,
                tracer_provider=tracer_provider,
            )
            for q in self.queues
        ]
        self.processor = self.processors[0]
        # Secrets are read now: a bad one fails the constructor, not the first delivery.
        self._on_message: list[Callable[..., str]] = list(self.processors)
        if signing_secrets is not None:
            self._on_message = [
                Verified(p, signing_secrets, max_age=signature_max_age) for p in self.processors
            ]
        # Reentrant: stop() may run in a signal handler on the thread that holds it in run().
        self._lock = threading.RLock()
        self._conn: Any = None
        self._channel: Any = None
        self._stop = False
        self._purge_stop = threading.Event()
        self.ready = threading.Event()  # set once consuming has started

    def run(self) -> None:
        """Consume until `stop()`; the delivery being handled finishes, the rest are requeued.

        Connects, starts the inbox purge (when `inbox_retention` is set), sets `ready` once
        consuming has started, and returns after `stop()`. pika's connection errors propagate.
        """
        # pika tries the nodes in order.
        conn = pika.BlockingConnection(connection_parameters(self.amqp_url, self.ssl_options))
        purger: threading.Thread | None = None
        self._purge_stop.clear()
        try:
            channel = conn.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            for queue, on_message in zip(self.queues, self._on_message, strict=True):
                channel.basic_consume(queue, on_message)
            with self._lock:
                self._conn, self._channel = conn, channel
                stop = self._stop
            if self.inbox_retention is not None:
                purger = threading.Thread(
                    target=self._purge_loop,
                    name=f"outbox-purge-{self.processor.consumer}",
                    daemon=True,
                )
                purger.start()
            self.ready.set()
            if not stop:
                channel.start_consuming()
        finally:
            self._purge_stop.set()
            with self._lock:
                self._conn = self._channel = None
            if conn.is_open:
                conn.close()
            if purger is not None:
                purger.join()  # at most the batch in hand: the loop stops between batches

    def stop(self) -> None:
        """Ask `run()` to return after the delivery in hand. Safe from any thread."""
        self._purge_stop.set()
        with self._lock:
            self._stop = True
            if self._conn is not None:
                self._conn.add_callback_threadsafe(self._channel.stop_consuming)

    def _purge_loop(self) -> None:
        """Purge now, then every `retention_interval` seconds, until `run()` ends."""
        while not self._purge_stop.is_set():
            self._purge()
            self._purge_stop.wait(self.retention_interval)

    def _purge(self) -> None:
        assert self.inbox_retention is not None
        cutoff = dt.datetime.now(dt.UTC) - self.inbox_retention
        consumer = self.processor.consumer
        deleted = 0
        try:
            for batch in self.transactions.purge(
                consumer, cutoff=cutoff, batch_size=self.purge_batch_size
            ):
                deleted += batch
                if self._purge_stop.is_set():
                    break
        # The database, the pool, or Django's connection: whatever failed, the purge is tried
        # again next interval, and the consumer goes on meanwhile.
        except Exception as exc:
            error = str(exc.orig) if isinstance(exc, DBAPIError) else str(exc)
            log.warning(
                "consumer.inbox_purge_failed consumer=%s: %s", consumer, error,
                extra={"consumer": consumer, "error": error},
            )  # fmt: skip
        if deleted:
            log.info(
                "consumer.inbox_purged consumer=%s deleted=%d", consumer, deleted,
                extra={"consumer": consumer, "deleted": deleted},
            )  # fmt: skip


@dataclass
class Consumer:
    """Consume `queue` with a `Processor` until `stop()`: prefetch, graceful stop, inbox retention.

    Each delivery runs `handler(session, message)` once per message id, in a transaction that
    also records the id in the inbox; the delivery is acknowledged after the commit. A handler
    that raises is retried through `<queue>.retry.<N>s` queues or dead-lettered to
    `<queue>.dead`, as `policy` decides (the consumer declares those queues; `queue` itself must
    exist). `run()` blocks; call `stop()` from a signal handler or another thread.

    Constructing a Consumer builds its Processor, which makes pika decode float header values
    as floats from then on, process-wide (see `Processor`): every message this consumer hands
    to its handler, the first included, has the floats the producer enqueued.

    Args:
        engine: The application's SQLAlchemy `Engine`; each delivery gets a `Session` of it.
        amqp_url: The broker's URL (`amqp://` or `amqps://`), or a cluster's nodes separated
            by commas: the first that answers is used.
        queue: The queue to consume.
        handler: `handler(session, message)`, called inside the transaction with a
            `Message`. Raise `Retry` to try again later, `Reject` to dead-letter the message;
            any other exception counts as a failed attempt.
        name: The consumer's name in the inbox (default: `queue`). Consumers with different
            names each process every message once; instances with the same name share the
            work and the deduplication.
        prefetch: How many unacknowledged deliveries the broker sends ahead.
        policy: Retries, backoff and dead-lettering (`ConsumerPolicy`).
        tracer_provider: The OpenTelemetry tracer provider for the `process` spans (default:
            the global one).
        inbox_retention: How long inbox rows are kept; keep it longer than any redelivery
            delay. None: never purged by this consumer.
        retention_interval: Seconds between purges, which run on a background thread and
            delete only this consumer's rows.
        purge_batch_size: Inbox rows deleted per statement.
        ssl_options: A `pika.SSLOptions` (a CA, a client certificate, the server name) for
            `amqps://` URLs; without it pika verifies the broker with the system's CAs.
        signing_secrets: The relay's signing secrets (`whsec_...`: one, several separated by
            commas, or a sequence): each delivery's signature is checked before anything else,
            and one that is missing or does not verify goes to `<queue>.dead` at once, counted
            as `bad_signature` (outbox/consumer/signed.py). None: no check.
        signature_max_age: With `signing_secrets`, refuse signatures older than this many
            seconds (None: any age; a message may wait in a queue for hours).
        partitions: `queue` is a partitioned queue of this many partitions (`partitions = N`
            in a topology file): consume its queues `<queue>.0` ... `<queue>.<N-1>`. Each has
            a single active consumer, so any number of processes may run this; the broker keeps
            one active per partition and moves it to another when that one's connection dies.
            Retries and dead letters stay per partition (`<queue>.<i>.retry.<N>s`,
            `<queue>.<i>.dead`); the inbox name is still `name` or `queue`.
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
    purge_batch_size: int = 1000
    ssl_options: pika.SSLOptions | None = None
    signing_secrets: str | Sequence[str] | None = None
    signature_max_age: float | None = None
    partitions: int | None = None

    def __post_init__(self) -> None:
        self.loop = ConsumerLoop(
            SessionTransactions(self.engine, self.handler),
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
        self.queues = self.loop.queues
        self.processors = self.loop.processors
        self.processor = self.loop.processor
        self.ready = self.loop.ready  # set once consuming has started

    def run(self) -> None:
        """Consume until `stop()`; the delivery being handled finishes, the rest are requeued.

        Connects, starts the inbox purge (when `inbox_retention` is set), sets `ready` once
        consuming has started, and returns after `stop()`. pika's connection errors propagate.
        """
        self.loop.run()

    def stop(self) -> None:
        """Ask `run()` to return after the delivery in hand. Safe from any thread."""
        self.loop.stop()
