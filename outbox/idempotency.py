"""An idempotency key that is taken: the id of the message that holds it, and the errors for a
holder this transaction cannot see. Shared by the table's inserts (outbox/enqueue.py) and logical
capture's held rows (outbox/pg_emit.py), so a taken key answers the same on both."""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, select
from sqlalchemy.exc import DBAPIError

from outbox.dberrors import sqlstate_of
from outbox.errors import IdempotencyConflict
from outbox.schema import message


def serialization_conflict(exc: DBAPIError, idempotency_key: str) -> IdempotencyConflict | None:
    """The error for an INSERT ... ON CONFLICT that failed because the key's holder committed
    after this transaction's snapshot; None for any other failure."""
    if sqlstate_of(exc.orig) != "40001":  # serialization_failure
        return None
    return IdempotencyConflict(
        f"idempotency key {idempotency_key!r} was taken by a transaction that committed "
        "after this one's snapshot (REPEATABLE READ or SERIALIZABLE); retry the "
        "transaction"
    )


def holder(conn: Connection, idempotency_key: str) -> uuid.UUID:
    """The id of the message holding `idempotency_key`, read after an INSERT ... ON CONFLICT DO
    NOTHING wrote nothing: it waited for a racing transaction holding the key to commit, and
    under READ COMMITTED this new statement sees the winner's row."""
    existing = conn.execute(
        select(message.c.id).where(message.c.idempotency_key == idempotency_key)
    ).scalar()
    if existing is None:
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} is held by a transaction whose row this one "
            "cannot see (it committed after this transaction's snapshot was taken); retry the "
            "transaction"
        )
    return uuid.UUID(str(existing))
