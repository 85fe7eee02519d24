"""`enqueue_many`: many messages into the caller's transaction, in a few statements.

Every item is checked and built by `enqueue`'s own `prepare` before any SQL, so one bad item
raises (naming its index) and nothing is written. The rows then go in the list's order, so `seq`
numbers them as the list does and one key's messages keep their order, a chunk of rows a
statement: on PostgreSQL one INSERT of arrays unnested (outbox/pg_insert.py), on MySQL and MariaDB
one INSERT of many VALUES tuples (outbox/mysql_insert.py), elsewhere (SQLite) SQLAlchemy's
executemany. A message with an idempotency key is written as `enqueue` writes it,
by a statement of its own at its place in the list. `enqueue_many_async`
(outbox/async_enqueue.py) prepares the same way and runs `write_many` on its connection. In
logical capture mode on PostgreSQL the messages go into the log instead, a chunk a statement, in
the list's order (outbox/pg_emit.py).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from outbox import pg_emit
from outbox.config import LOGICAL, settings
from outbox.databases import Database, Inserts, database_of
from outbox.enqueue import app_clock, core_params, enqueue, insert_idempotent, notify_now
from outbox.errors import InvalidMessage, SchemaMissing
from outbox.prepared import Prepared, prepare, runs
from outbox.schema import is_missing_table
from outbox.sessions import Db, sync_connection

_CALL = "outbox.enqueue_many"
ASYNC_CALL = "outbox.enqueue_many_async"
# enqueue's keyword arguments, the ones an item must have, and the others' defaults: read from
# its signature, so that an item means what the same call of enqueue would.
_KEYWORDS = [p for p in inspect.signature(enqueue).parameters.values() if p.name != "db"]
REQUIRED = tuple(p.name for p in _KEYWORDS if p.default is p.empty)
DEFAULTS: Mapping[str, Any] = {p.name: p.default for p in _KEYWORDS if p.default is not p.empty}
ARGUMENTS = frozenset(REQUIRED) | frozenset(DEFAULTS)
# Rows per executemany where SQLAlchemy's Core writes them (SQLite, and drivers without a path of
# their own in outbox/databases.py).
CORE_CHUNK = 1_000


def enqueue_many(db: Db, messages: Iterable[Mapping[str, Any]]) -> list[uuid.UUID]:
    """Add many messages to the caller's transaction; return their ids, in the items' order.

    `enqueue` for a list: each item is a mapping of `enqueue`'s keyword arguments
    (`{"exchange": "orders", "routing_key": "order.created", "payload": {...}, "key": ...}`).
    Every item is checked before anything is written, so one invalid item raises and the
    transaction is left as it was. The rows are inserted in the list's order, in a few
    statements (one INSERT per 1,000 messages on PostgreSQL, MySQL and MariaDB), so messages
    with the same `key` are published in list order, after the key's earlier messages. On
    PostgreSQL the commit wakes an idle relay once for the whole call (a NOTIFY, rationed as
    `enqueue`'s). An empty list returns `[]` and runs no SQL.

    A message with an `idempotency_key` is written as `enqueue` writes it, by a statement of its
    own at its place in the list: when the key is taken, by an existing row or by an earlier item
    of the same list, it writes nothing and its id in the result is the id of the message that
    holds the key.

    Args:
        db: The caller's transaction, as for `enqueue`: a SQLAlchemy `Session`,
            `scoped_session` or `Connection`, or a DB-API connection inside its transaction
            (psycopg 3, psycopg2, `sqlite3`, PyMySQL). For an async handle, use
            `enqueue_many_async`.
        messages: The messages, each a mapping of `enqueue`'s keyword arguments: `exchange`,
            `routing_key` and `payload` required; `key`, `headers`, `idempotency_key`, `delay`,
            `priority`, `max_attempts` and `content_type` optional, with `enqueue`'s defaults.

    Returns:
        The message ids (UUIDv7), one per item, in the items' order.

    Raises:
        InvalidSession: `db` is none of the above.
        NotInTransaction: `db` is a DB-API connection in autocommit mode, outside any
            transaction.
        InvalidMessage: An item is invalid: not a mapping, missing `exchange`, `routing_key` or
            `payload`, with an argument `enqueue` does not take, or with an argument `enqueue`
            would refuse (then the subclass `enqueue` raises: `PayloadEncodingError`,
            `InvalidHeader`, ...). The message starts with the item's index
            (`messages[3]: ...`). Nothing is written.
        SchemaMissing: The outbox tables do not exist in this database.
        IdempotencyConflict: As for `enqueue`: a concurrent transaction holds one of the
            idempotency keys and this one cannot see its row; retry the transaction.
        UnsupportedDatabase: The database is not PostgreSQL, MySQL/MariaDB or SQLite.
        CaptureNotSetUp: Logical capture is on, and the database has no replication slot for
            the relay. Nothing is written.
    """
    other = None
    if not isinstance(db, Session | Connection):
        other = sync_connection(db, call=_CALL, async_call=ASYNC_CALL, writes=True)
    prepared = prepare_many(messages)
    if not prepared:
        return []
    if other is not None:
        with other as conn:
            return write_many(conn, prepared)
    return write_many(
        db.connection() if isinstance(db, Session) else cast(Connection, db), prepared
    )


def prepare_many(messages: Iterable[Mapping[str, Any]]) -> list[Prepared]:
    """Check and build every item; raise an `InvalidMessage` naming the first bad one's index."""
    if isinstance(messages, Mapping | str | bytes) or not isinstance(messages, Iterable):
        raise InvalidMessage(
            "messages must be a list of mappings of enqueue's keyword arguments, "
            f"not {type(messages).__name__}"
        )
    return [_prepare_one(index, item) for index, item in enumerate(messages)]


def _prepare_one(index: int, item: object) -> Prepared:
    where = f"messages[{index}]"
    if not isinstance(item, Mapping):
        raise InvalidMessage(
            f"{where} must be a mapping of enqueue's keyword arguments, not {type(item).__name__}"
        )
    unknown = [name for name in item if name not in ARGUMENTS]
    if unknown:
        listed = ", ".join(repr(name) for name in unknown)
        raise InvalidMessage(f"{where}: enqueue takes no argument {listed}")
    missing = [name for name in REQUIRED if name not in item]
    if missing:
        raise InvalidMessage(f"{where}: {', '.join(missing)} missing")
    try:
        return prepare(**{**DEFAULTS, **item})
    except InvalidMessage as exc:
        raise type(exc)(f"{where}: {exc}") from exc


def write_many(conn: Connection, prepared: Sequence[Prepared]) -> list[uuid.UUID]:
    """Insert prepared messages on `conn`, in its current transaction and in their order; return
    their ids (an earlier message's where an idempotency key is taken). `enqueue_many_async`
    runs this too, on the sync face of its AsyncConnection. In logical capture mode on
    PostgreSQL, the messages go into the log (outbox/pg_emit.py)."""
    database = database_of(conn.dialect.name)  # before any SQL
    try:
        if database.has_log and settings().capture == LOGICAL:
            return pg_emit.write_many(conn, prepared)
        return _insert_many(conn, database, prepared)
    except DBAPIError as exc:
        if is_missing_table(exc):
            raise SchemaMissing(SchemaMissing.__doc__) from exc
        raise


def _insert_many(
    conn: Connection, database: Database, prepared: Sequence[Prepared]
) -> list[uuid.UUID]:
    statements = database.inserts
    wake = statements.notify if statements.notify is not None and notify_now() else None
    ids: list[uuid.UUID] = []
    for run in runs(prepared, _has_idempotency_key):
        key = run[0].idempotency_key
        if key is not None:  # a run of one
            params = core_params(statements, run[0], app_clock(statements))
            ids.append(insert_idempotent(conn, statements, params, key))
            continue
        if not database.direct_insert_many(conn, run):
            _insert_core(conn, statements, run)
        ids.extend(one.id for one in run)
    if wake is not None:
        conn.exec_driver_sql(wake)
    return ids


def _has_idempotency_key(prepared: Prepared) -> bool:
    return prepared.idempotency_key is not None


def _insert_core(conn: Connection, statements: Inserts, run: Sequence[Prepared]) -> None:
    """`run` through SQLAlchemy's executemany, CORE_CHUNK rows a call: the driver's executemany,
    or SQLAlchemy's multi-row INSERTs where the dialect batches them itself."""
    now = app_clock(statements)
    for start in range(0, len(run), CORE_CHUNK):
        chunk = run[start : start + CORE_CHUNK]
        conn.execute(statements.insert, [core_params(statements, one, now) for one in chunk])
