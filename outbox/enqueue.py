"""`enqueue`: add one message row to the caller's transaction, and nothing else.

It never commits, never flushes the caller's ORM objects, never runs DDL. Every argument is
validated before the INSERT is built (`outbox.prepared`), so an invalid call leaves the
transaction untouched. `enqueue_async` (`outbox.async_enqueue`) prepares the same way and runs
this module's `write` on its connection: one implementation for both. In logical capture mode on
PostgreSQL (`outbox.configure(capture="logical")`), `write` hands the message to
outbox/pg_emit.py, which writes it into the transaction's log instead of the table.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from outbox import pg_emit
from outbox.config import LOGICAL, LibrarySettings, settings
from outbox.databases import Inserts, database_of
from outbox.dberrors import sqlstate_of
from outbox.errors import IdempotencyConflict, SchemaMissing
from outbox.idempotency import holder, serialization_conflict
from outbox.pg_insert import NOTIFY_CHANNEL as NOTIFY_CHANNEL  # the relay LISTENs on it
from outbox.prepared import Prepared, prepare
from outbox.ration import NotifyRation
from outbox.schema import is_missing_table
from outbox.sessions import Db, sync_connection

_CALL = "outbox.enqueue"
ASYNC_CALL = "outbox.enqueue_async"


def enqueue(
    db: Db,
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

    The message is one INSERT in the transaction `db` is in: it never commits, never flushes
    the caller's other objects, never runs DDL. If the transaction rolls back, the message never
    existed; once it commits, the relay publishes it. Every argument is checked before anything
    is written, so a refused call leaves the transaction as it was. When an OpenTelemetry span
    is current, its trace context is stored with the message and published with it. On
    PostgreSQL the commit also wakes an idle relay (a NOTIFY, rationed per process: see
    `outbox.configure`). In logical capture mode on PostgreSQL (`outbox.configure(capture=
    "logical")`), the message is written into the transaction's write-ahead log instead of a
    row (a message with an idempotency key or a delay gets a held row as well), and nothing
    is notified.

    Args:
        db: The caller's transaction: a SQLAlchemy `Session`, `scoped_session` (Flask-SQLAlchemy's
            `db.session`) or `Connection`, or a DB-API connection inside its transaction
            (psycopg 3, psycopg2, `sqlite3`, PyMySQL), which is used and left open, never
            committed. For an async handle, use `enqueue_async`; for Django,
            `outbox.django.enqueue`.
        exchange: The RabbitMQ exchange to publish to; `""` is the default exchange, which
            delivers to the queue named by `routing_key`.
        routing_key: The routing key to publish with.
        payload: The body. A `dict`, `list`, dataclass or pydantic model is sent as compact
            JSON (`application/json`); inside it, `datetime`, `date`, `time`, `UUID`, `Decimal`,
            enums, dataclasses and pydantic models convert too, and what
            `outbox.configure(json_default=...)` converts. A `str` is sent as UTF-8 text
            (`text/plain; charset=utf-8`), `bytes` as they are (`application/octet-stream`).
        key: An ordering key (for example the aggregate's id): messages with the same key are
            published in enqueue order, one after another. None: no order with other messages.
        headers: AMQP headers to publish with; values are `str`, `int`, `float` or `bool`.
            Names starting with `x-outbox-`, and `traceparent` and `tracestate`, are the relay's.
        idempotency_key: A second enqueue with the same key writes nothing and returns the
            first message's id.
        delay: Publish no earlier than this long from now: seconds, or a `timedelta` (at
            most 3,650 days).
        priority: Among messages ready to go, higher priorities are claimed first.
        max_attempts: How many times the relay tries to publish before dead-lettering the
            message; None: the relay's configured default (`--max-attempts`).
        content_type: The AMQP content type, instead of the one derived from `payload`.

    Returns:
        The message id, a UUIDv7. It is also the AMQP `message_id` of every publish of the
            message, retries and replays included.

    Raises:
        InvalidSession: `db` is none of the above (the message names what was passed, the
            right call for an async handle, and says when an Engine was passed instead of a
            transaction).
        NotInTransaction: `db` is a DB-API connection in autocommit mode, outside any
            transaction: the message would commit on its own.
        InvalidMessage: An argument is invalid; one of its subclasses says which:
            `InvalidDestination`, `PayloadEncodingError`, `PayloadTooLarge`, `InvalidHeader`,
            `InvalidOption`. Nothing is written.
        SchemaMissing: The outbox tables do not exist in this database.
        IdempotencyConflict: A concurrent transaction holds the same `idempotency_key` and
            this one cannot see its row; retry the transaction.
        UnsupportedDatabase: The database is not PostgreSQL, MySQL/MariaDB or SQLite.
        CaptureNotSetUp: Logical capture is on, and the database has no replication slot for
            the relay. Nothing is written.
    """
    # A Session or Connection goes straight to `write`; any other handle is resolved (and an
    # object enqueue does not take refused) before the arguments are checked.
    other = None
    if not isinstance(db, Session | Connection):
        other = sync_connection(db, call=_CALL, async_call=ASYNC_CALL, writes=True)
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
    if other is not None:
        with other as conn:
            return write(conn, prepared)
    # Session.connection() joins the session's transaction without autoflushing the caller's
    # pending objects; taken only now, so a refused call does not even begin a transaction.
    return write(db.connection() if isinstance(db, Session) else cast(Connection, db), prepared)


def write(conn: Connection, prepared: Prepared) -> uuid.UUID:
    """Insert a prepared message on `conn`, in its current transaction; return the message's id
    (an earlier message's, when its idempotency key is taken). `enqueue_async` runs this too, on
    the sync face of its AsyncConnection, so both translate errors and race the same way. In
    logical capture mode on PostgreSQL, the message goes into the log (outbox/pg_emit.py)."""
    database = database_of(conn.dialect.name)  # before any SQL
    try:
        if database.has_log and settings().capture == LOGICAL:
            return pg_emit.write(conn, prepared)
        statements = database.inserts
        wake = statements.notify if statements.notify is not None and notify_now() else None
        if database.direct_insert(conn, prepared, notify=wake is not None):
            return prepared.id
        return _insert(conn, statements, prepared, wake)
    except DBAPIError as exc:
        if is_missing_table(exc):
            raise SchemaMissing(SchemaMissing.__doc__) from exc
        raise


def _insert(
    conn: Connection, statements: Inserts, prepared: Prepared, wake: str | None
) -> uuid.UUID:
    """The insert through SQLAlchemy (where `direct_insert` declined), then `wake` if given."""
    params = core_params(statements, prepared, app_clock(statements))
    if prepared.idempotency_key is None:
        conn.execute(statements.insert, params)
        result = prepared.id
    else:
        result = insert_idempotent(conn, statements, params, prepared.idempotency_key)
    if wake is not None:
        conn.exec_driver_sql(wake)
    return result


def app_clock(statements: Inserts) -> dt.datetime | None:
    """The application's clock where the database takes the row's times from it (SQLite); None
    where the database stamps the row itself."""
    return None if statements.server_clock else dt.datetime.now(dt.UTC)


def core_params(statements: Inserts, prepared: Prepared, now: dt.datetime | None) -> dict[str, Any]:
    """The bind values of `statements`' INSERT for `prepared`: the delay where the database
    stamps the row, else the times from `now`, the application's clock."""
    params = dict(prepared.params)
    if now is None:
        params["delay"] = prepared.wait or _ZERO
        params["delay_us"] = (prepared.wait or _ZERO) // _MICROSECOND
    else:
        params["created_at"] = now
        params["available_at"] = now + prepared.wait if prepared.wait else now
    return params


_ZERO = dt.timedelta(0)
_MICROSECOND = dt.timedelta(microseconds=1)
_ration: tuple[LibrarySettings, NotifyRation] | None = None  # and the settings it was made for


def notify_now() -> bool:
    """Whether this insert should wake an idle relay at commit (PostgreSQL delivers NOTIFY at
    commit, and not at all on rollback): the process's ration (outbox/ration.py) decides."""
    global _ration
    current = settings()
    if not current.notify:
        return False
    held = _ration
    if held is None or held[0] is not current:  # a full bucket for each configure()
        held = _ration = (current, NotifyRation(current.notify_rate, current.notify_burst))
    return held[1].take(time.monotonic())


def insert_idempotent(
    conn: Connection, statements: Inserts, params: dict[str, Any], idempotency_key: str
) -> uuid.UUID:
    """Insert unless `idempotency_key` is taken; the id of the row that holds it either way."""
    if statements.existing is not None:
        return _insert_idempotent_mysql(conn, statements, params, idempotency_key)
    try:
        inserted = conn.execute(statements.insert_or_nothing, params).scalar()
    except DBAPIError as exc:
        conflict = serialization_conflict(exc, idempotency_key)
        if conflict is not None:
            raise conflict from exc
        raise
    if inserted is not None:
        return uuid.UUID(str(inserted))
    return holder(conn, idempotency_key)


def _insert_idempotent_mysql(
    conn: Connection, statements: Inserts, params: dict[str, Any], idempotency_key: str
) -> uuid.UUID:
    assert statements.existing is not None
    try:
        conn.execute(statements.insert, params)
        return uuid.UUID(str(params["id"]))
    except DBAPIError as exc:
        sqlstate = sqlstate_of(exc.orig)
        if sqlstate == "40P01":
            # Two transactions waited for a third holding the key, which rolled back; InnoDB
            # chose this one and rolled it back whole.
            raise IdempotencyConflict(
                f"idempotency key {idempotency_key!r}: the database rolled this transaction back "
                "(a deadlock between transactions enqueueing the same key); retry the transaction"
            ) from exc
        if sqlstate != "23505":  # unique_violation: the key (ids are unique by construction)
            raise
    # Like PostgreSQL, the INSERT waited for a racing transaction holding the key to commit.
    existing = conn.execute(statements.existing, {"idempotency_key": idempotency_key}).scalar()
    if existing is None:  # the row went (retention) between the INSERT and this read
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} was taken by a row that is gone now; retry "
            "the transaction"
        )
    return uuid.UUID(str(existing))
