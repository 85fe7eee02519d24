"""`enqueue_async` and `enqueue_many_async`: `enqueue` and `enqueue_many` for SQLAlchemy's
AsyncSession and AsyncConnection, and for asyncpg's and psycopg's async connections.

Not a second implementation: the messages are validated and built by the same `prepare`, in the
caller's task (so the trace context captured is the caller's), and inserted by the same `write`
(`write_many`), which SQLAlchemy runs on the sync face of the async connection (`run_sync`).
Idempotency races, NOTIFY, logical capture, `SchemaMissing` and error translation are therefore
exactly `enqueue`'s, on asyncpg, psycopg's async mode and aiosqlite alike.

Loaded on first use of `outbox.enqueue_async` or `outbox.enqueue_many_async`: `import outbox`
does not import SQLAlchemy's asyncio extension (nor greenlet).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

from outbox.enqueue import write
from outbox.many import prepare_many, write_many
from outbox.plain import AsyncDBAPIConnection, driver_of, refuse_autocommit
from outbox.prepared import prepare
from outbox.sessions import wrong_object

AsyncDb = AsyncSession | async_scoped_session[Any] | AsyncConnection | AsyncDBAPIConnection
_CALL = "outbox.enqueue_async"
_MANY_CALL = "outbox.enqueue_many_async"


async def enqueue_async(
    db: AsyncDb,
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
) -> uuid.UUID:
    """Add a message to the caller's transaction; return its id (also the AMQP message_id).

    `enqueue` for SQLAlchemy's asyncio extension: the same arguments, the same checks, the same
    row and the same errors, with an `AsyncSession` or `AsyncConnection` inside the caller's
    transaction (asyncpg, psycopg's async mode, aiosqlite). It never commits, never flushes the
    caller's other objects, never runs DDL.

    Args:
        db: The caller's transaction: a SQLAlchemy `AsyncSession`, `async_scoped_session` or
            `AsyncConnection`, or an asyncpg connection or psycopg `AsyncConnection` inside its
            transaction (used and left open, never committed). For a sync handle, use
            `enqueue`.
        exchange: As for `enqueue`.
        routing_key: As for `enqueue`.
        payload: As for `enqueue`.
        key: As for `enqueue`.
        headers: As for `enqueue`.
        idempotency_key: As for `enqueue`.
        delay: As for `enqueue`.
        priority: As for `enqueue`.
        max_attempts: As for `enqueue`.
        content_type: As for `enqueue`.

    Returns:
        The message id, a UUIDv7. It is also the AMQP `message_id` of every publish of the
            message.

    Raises:
        InvalidSession: `db` is none of the above.
        NotInTransaction: `db` is an asyncpg or psycopg connection outside any transaction.
        InvalidMessage: An argument is invalid (see `enqueue`). Nothing is written.
        SchemaMissing: The outbox tables do not exist in this database.
        IdempotencyConflict: A concurrent transaction holds the same `idempotency_key` and
            this one cannot see its row; retry the transaction.
        CaptureNotSetUp: As for `enqueue`: logical capture is on, and the database has no
            replication slot for the relay. Nothing is written.
    """
    # Before anything else is done: an object this does not take is refused first.
    handle = async_connection(db, call=_CALL, sync_call="outbox.enqueue", writes=True)
    prepared = prepare(
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
    async with handle as conn:
        return await conn.run_sync(write, prepared)


async def enqueue_many_async(db: AsyncDb, messages: Iterable[Mapping[str, Any]]) -> list[uuid.UUID]:
    """Add many messages to the caller's transaction; return their ids, in the items' order.

    `enqueue_many` for SQLAlchemy's asyncio extension and for asyncpg's and psycopg's async
    connections: the same items, the same checks (every item before anything is written), the
    same statements and the same errors.

    Args:
        db: The caller's transaction, as for `enqueue_async`.
        messages: As for `enqueue_many`: mappings of `enqueue`'s keyword arguments.

    Returns:
        The message ids, one per item, in the items' order.

    Raises:
        InvalidSession: `db` is none of what `enqueue_async` takes.
        NotInTransaction: `db` is an asyncpg or psycopg connection outside any transaction.
        InvalidMessage: An item is invalid (see `enqueue_many`). Nothing is written.
        SchemaMissing: The outbox tables do not exist in this database.
        IdempotencyConflict: A concurrent transaction holds one of the idempotency keys and
            this one cannot see its row; retry the transaction.
        CaptureNotSetUp: As for `enqueue`. Nothing is written.
    """
    handle = async_connection(db, call=_MANY_CALL, sync_call="outbox.enqueue_many", writes=True)
    prepared = prepare_many(messages)
    if not prepared:
        return []
    async with handle as conn:
        return await conn.run_sync(write_many, prepared)


def async_connection(
    db: object, *, call: str, sync_call: str, writes: bool
) -> AbstractAsyncContextManager[AsyncConnection]:
    """`db`'s connection, for an `async with` block: an AsyncSession's (or an
    async_scoped_session's current one's) joins its transaction without autoflushing (as
    `Session.connection()` does for `enqueue`), an AsyncConnection is used as it is, an asyncpg
    connection or psycopg AsyncConnection is lent in its current transaction. Anything else
    raises `InvalidSession`, naming `sync_call` for a sync handle; when `writes`, a DB-API
    connection outside any transaction raises `NotInTransaction`. Both before anything is done
    on `db`."""
    if isinstance(db, AsyncSession | async_scoped_session):
        return _session_connection(db)
    if isinstance(db, AsyncConnection):
        return nullcontext(db)
    driver = driver_of(db)
    if driver is None or not driver.is_async:
        raise wrong_object(db, call=call, other_call=sync_call, wants_async=True)
    if writes:
        refuse_autocommit(db, driver, call=call)
    from outbox.borrowed import lend_async

    return lend_async(db, driver)


@asynccontextmanager
async def _session_connection(
    session: AsyncSession | async_scoped_session[Any],
) -> AsyncIterator[AsyncConnection]:
    yield await session.connection()
