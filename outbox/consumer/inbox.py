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
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from outbox.errors import InvalidOption
from outbox.schema import inbox

# RETURNING tells whether a row went in (psycopg reports no rowcount for this statement).
_INSERT = {
    "postgresql": postgresql.insert(inbox).on_conflict_do_nothing().returning(inbox.c.consumer),
    "sqlite": sqlite.insert(inbox).on_conflict_do_nothing().returning(inbox.c.consumer),
}


def process_once(db: Session | Connection, *, consumer: str, message_id: str) -> bool:
    """Record `message_id` for `consumer` in the caller's transaction; False if already there."""
    if not consumer or not message_id:
        raise InvalidOption("process_once needs a consumer name and a message id")
    if len(consumer) > 255 or len(message_id) > 255:
        raise InvalidOption("consumer names and message ids are at most 255 characters")
    conn = db.connection() if isinstance(db, Session) else db
    statement: Any = _INSERT.get(conn.dialect.name)
    if statement is None:
        raise InvalidOption(f"the inbox supports PostgreSQL and SQLite, not {conn.dialect.name}")
    row = {"consumer": consumer, "message_id": message_id, "processed_at": _now()}
    return conn.execute(statement, row).first() is not None


def purge_inbox(
    bind: Engine | Connection, *, older_than: dt.timedelta, batch_size: int = 1000
) -> int:
    """Delete inbox rows processed more than `older_than` ago, in small transactions."""
    cutoff = _now() - older_than
    total = 0
    while True:
        victims = (
            select(inbox.c.consumer, inbox.c.message_id)
            .where(inbox.c.processed_at < cutoff)
            .limit(batch_size)
        )
        if isinstance(bind, Engine):
            with bind.begin() as conn:
                deleted = _delete(conn, victims)
        else:
            deleted = _delete(bind, victims)
        total += deleted
        if deleted < batch_size:
            return total


def _delete(conn: Connection, victims: Any) -> int:
    keys = [tuple(r) for r in conn.execute(victims)]
    for consumer, message_id in keys:
        conn.execute(
            delete(inbox).where(inbox.c.consumer == consumer, inbox.c.message_id == message_id)
        )
    return len(keys)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
