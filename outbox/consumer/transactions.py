"""Where a consumer's handler runs: the database side of `Processor` and `Consumer`, as a port.

A delivery's transaction records the message id in the inbox and, when the id is new, runs the
handler; the inbox is purged from a thread of its own. `SessionTransactions` does both with a
SQLAlchemy `Engine` (`outbox.Consumer`); `outbox.django` does them on Django's connection, in
`transaction.atomic()`. Everything else a consumer does (ack, retry, dead-letter, signatures,
prefetch, a graceful stop) is the same for both.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from outbox.consumer.inbox import process_once, purge_batches

if TYPE_CHECKING:
    from outbox.consumer.processor import Handler, Message


class Transactions(Protocol):
    """The database a consumer works in."""

    def run(self, consumer: str, message: Message) -> bool:
        """In one transaction, record `message.id` for `consumer` in the inbox and, when it was
        not there yet, run the handler; commit. Whether the handler ran (False: a duplicate).
        An exception rolls back the handler's writes and the inbox row together, and propagates.
        Called on the consuming connection's thread, one delivery at a time."""
        ...

    def purge(self, consumer: str, *, cutoff: dt.datetime, batch_size: int) -> Iterator[int]:
        """Delete `consumer`'s inbox rows processed before `cutoff`, one bounded DELETE per
        batch, yielding each batch's count. Called on the purge thread, never the consuming
        one."""
        ...


class SessionTransactions:
    """Each delivery in a `Session` of `engine`: `handler(session, message)` runs in its
    transaction, with the inbox row written through the same session."""

    def __init__(self, engine: Engine, handler: Handler) -> None:
        self.engine = engine
        self.handler = handler

    def run(self, consumer: str, message: Message) -> bool:
        with Session(self.engine) as session, session.begin():
            new = process_once(session, consumer=consumer, message_id=message.id)
            if new:
                self.handler(session, message)
        return new

    def purge(self, consumer: str, *, cutoff: dt.datetime, batch_size: int) -> Iterator[int]:
        return purge_batches(self.engine, consumer=consumer, cutoff=cutoff, batch_size=batch_size)
