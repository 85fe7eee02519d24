"""The inbox: a consumer records each message id in its own transaction, so a message delivered
twice (RabbitMQ delivers at least once) changes the application's data once.

    with Session(engine) as session, session.begin():
        if outbox.process_once(session, consumer="billing", message_id=props.message_id):
            apply(session, body)            # runs at most once per message id and consumer
    channel.basic_ack(delivery_tag)         # only after the commit

Two deliveries racing in two transactions: the second INSERT waits on the first's unique-index
entry and, once it commits, inserts nothing (it returns False); if the first rolls back, the
second goes ahead. Rows are kept for a retention window (`purge_inbox`): a duplicate that arrives
after its id was purged is processed again, so keep the window longer than any redelivery delay.
Each consumer purges its own rows only: consumers may keep different windows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import Connection, Engine, select

from outbox.databases import database_named, database_of
from outbox.errors import InvalidOption
from outbox.schema import inbox
from outbox.sessions import Db, sync_connection

if TYPE_CHECKING:
    from outbox.async_enqueue import AsyncDb

T = TypeVar("T")


def process_once(db: Db, *, consumer: str, message_id: str) -> bool:
    """Record `message_id` for `consumer` in the caller's transaction; False if already there.

    For a consumer of your own (any AMQP client): call it first in the transaction that applies
    the message, apply the message only when it returns True, and acknowledge the delivery after
    the commit. A message delivered twice then changes your data once. Two deliveries racing in
    two transactions: the second waits for the first and, once it commits, returns False.
    `Consumer` and `Processor` call it for you.

    Args:
        db: The transaction that applies the message: anything `outbox.enqueue` takes (a
            SQLAlchemy Session, scoped_session or Connection, a DB-API connection inside its
            transaction). For an async handle, use `process_once_async`.
        consumer: The consumer's name: each name processes every message once.
        message_id: The delivery's AMQP `message_id`.

    Returns:
        True if the id was recorded now (process the message), False if this consumer already
            processed it (acknowledge and skip it).

    Raises:
        InvalidSession: `db` is none of the above.
        NotInTransaction: `db` is a DB-API connection in autocommit mode, outside any
            transaction: the record would commit apart from what the message changes.
        InvalidOption: `consumer` or `message_id` is empty or longer than 255 characters, or the
            database is not PostgreSQL, MySQL/MariaDB or SQLite.
    """
    handle = sync_connection(
        db, call="outbox.process_once", async_call="outbox.process_once_async", writes=True
    )
    _check(consumer, message_id)
    with handle as conn:
        return record(conn, consumer=consumer, message_id=message_id)


async def process_once_async(db: AsyncDb, *, consumer: str, message_id: str) -> bool:
    """`process_once`, for anything `outbox.enqueue_async` takes (an AsyncSession, an
    AsyncConnection, an asyncpg connection or psycopg AsyncConnection inside its transaction).

    Returns:
        True if the id was recorded now (process the message), False if this consumer already
            processed it (acknowledge and skip it).
    """
    from outbox.async_enqueue import async_connection  # SQLAlchemy's asyncio extension

    handle = async_connection(
        db, call="outbox.process_once_async", sync_call="outbox.process_once", writes=True
    )
    _check(consumer, message_id)
    async with handle as conn:
        return await conn.run_sync(record, consumer=consumer, message_id=message_id)


def _check(consumer: str, message_id: str) -> None:
    if not consumer or not message_id:
        raise InvalidOption("process_once needs a consumer name and a message id")
    if len(consumer) > 255 or len(message_id) > 255:
        raise InvalidOption("consumer names and message ids are at most 255 characters")


def record(conn: Connection, *, consumer: str, message_id: str) -> bool:
    """Insert the inbox row on `conn` (values checked by the caller); whether it went in."""
    database = database_named(conn.dialect.name)
    if database is None:
        raise InvalidOption(
            f"the inbox supports PostgreSQL, MySQL/MariaDB and SQLite, not {conn.dialect.name}"
        )
    row = {"consumer": consumer, "message_id": message_id, "processed_at": _now()}
    return database.record_inbox(conn, row)


def purge_inbox(
    bind: Engine | Connection,
    *,
    older_than: dt.timedelta,
    batch_size: int = 1000,
    consumer: str | None = None,
) -> int:
    """Delete inbox rows processed more than `older_than` ago; return how many.

    A duplicate that arrives after its id was purged is processed again, so keep `older_than`
    longer than any redelivery delay. A running `Consumer` purges its own rows by itself
    (`inbox_retention`); this is for consumers of your own, and for clean-ups.

    Args:
        bind: A SQLAlchemy `Engine` (each batch is one DELETE in a transaction of its own) or
            `Connection` (every batch in its transaction).
        older_than: How long a processed id is kept.
        batch_size: Rows deleted per statement at most.
        consumer: Purge this consumer's rows only; None purges every consumer's (for example
            after a consumer was retired).

    Returns:
        How many inbox rows were deleted.

    Raises:
        InvalidOption: `batch_size` is less than 1.
        UnsupportedDatabase: `bind` is not PostgreSQL, MySQL/MariaDB or SQLite (before any SQL).
    """
    if batch_size < 1:
        raise InvalidOption("batch_size must be at least 1")
    database_of(bind.dialect.name)  # an unsupported database fails here, not after a query
    cutoff = _now() - older_than
    names = [consumer] if consumer is not None else _in_transaction(bind, _consumers)
    return sum(
        sum(purge_batches(bind, consumer=n, cutoff=cutoff, batch_size=batch_size)) for n in names
    )


def purge_batches(
    bind: Engine | Connection, *, consumer: str, cutoff: dt.datetime, batch_size: int
) -> Iterator[int]:
    """Delete `consumer`'s rows processed before `cutoff`, one bounded DELETE per batch, and
    yield each batch's count: a caller can stop between batches (see `Consumer`)."""
    statement = database_of(bind.dialect.name).purge_inbox_batch(consumer, cutoff, batch_size)
    while True:
        deleted = _in_transaction(bind, lambda conn: int(conn.execute(statement).rowcount))
        yield deleted
        if deleted < batch_size:
            return


def _consumers(conn: Connection) -> list[str]:
    return list(conn.execute(select(inbox.c.consumer).distinct()).scalars())


def _in_transaction(bind: Engine | Connection, work: Callable[[Connection], T]) -> T:
    """`work(conn)` in a transaction of its own (Engine) or in the caller's (Connection)."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            return work(conn)
    return work(bind)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
