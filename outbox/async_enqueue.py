"""`enqueue_async`: `enqueue` for SQLAlchemy's AsyncSession and AsyncConnection.

Not a second implementation: the message is validated and built by the same `prepare`, in the
caller's task (so the trace context captured is the caller's), and inserted by the same `write`,
which SQLAlchemy runs on the sync face of the async connection (`run_sync`). Idempotency races,
NOTIFY, `SchemaMissing` and error translation are therefore exactly `enqueue`'s, on asyncpg,
psycopg's async mode and aiosqlite alike.

Loaded on first use of `outbox.enqueue_async`: `import outbox` does not import SQLAlchemy's
asyncio extension (nor greenlet).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from outbox.enqueue import write
from outbox.prepared import prepare
from outbox.sessions import wrong_object

AsyncDb = AsyncSession | AsyncConnection
_CALL = "outbox.enqueue_async"


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
        db: A SQLAlchemy `AsyncSession` or `AsyncConnection`, inside the caller's transaction.
            For a sync `Session` or `Connection`, use `enqueue`.
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
        InvalidSession: `db` is not an AsyncSession or AsyncConnection.
        InvalidMessage: An argument is invalid (see `enqueue`). Nothing is written.
        SchemaMissing: The outbox tables do not exist in this database.
        IdempotencyConflict: A concurrent transaction holds the same `idempotency_key` and
            this one cannot see its row; retry the transaction.
    """
    if not isinstance(db, AsyncSession | AsyncConnection):  # before anything else is done
        raise wrong_object(db, call=_CALL, other_call="outbox.enqueue", wants_async=True)
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
    conn = await async_connection(db, call=_CALL, sync_call="outbox.enqueue")
    return await conn.run_sync(write, prepared)


async def async_connection(db: object, *, call: str, sync_call: str) -> AsyncConnection:
    """`db`'s connection: an AsyncSession's joins its transaction without autoflushing (as
    `Session.connection()` does for `enqueue`); an AsyncConnection is used as it is. Anything
    else raises `InvalidSession`, naming `sync_call` for a sync Session or Connection."""
    if isinstance(db, AsyncSession):
        return await db.connection()
    if isinstance(db, AsyncConnection):
        return db
    raise wrong_object(db, call=call, other_call=sync_call, wants_async=True)
