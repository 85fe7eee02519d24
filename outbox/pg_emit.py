"""`enqueue` on PostgreSQL in logical capture mode (`outbox.configure(capture="logical")`): the
message goes into the transaction's write-ahead log, not into outbox_message.

`SELECT pg_logical_emit_message(true, 'outbox', <outbox.logged's bytes>)` writes a transactional
logical decoding message: it exists only if the transaction commits, and the relay reads it from
its replication slot in commit order. No row means no index entries, no dead tuples to vacuum and
no NOTIFY (the slot's stream wakes the relay).

A message with an idempotency key or a delay needs a row at enqueue time all the same: a second
enqueue must find the key, and `outbox-relay cancel` a delayed message. It gets one, inserted as the
table's path inserts it but held (`available_at` = `logged.HELD_UNTIL`, so no relay claims it), and
its message says so (`has_row`); the relay, reading the message in commit order, gives the row its
time. Both are one statement: the INSERT in a CTE and the message emitted for each row it returns,
so a taken key writes nothing and emits nothing, and the message's time is the row's `created_at`
(`statement_timestamp()`).

Without the slot, PostgreSQL keeps the messages for no one: the first logical enqueue of a process
on a database checks that the slot exists (`CaptureNotSetUp` before anything is written if not),
and the answer is kept for the process, by server and database name as the driver knows them.

The statements are compiled once per driver and sent as the driver's own SQL
(outbox/pg_insert.py's reasons: Core's per-call work costs as much as the round trip), with the
cursor events instrumentation listens to; another driver, or a schema translate map, runs them
through Core.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    CursorResult,
    Select,
    TextClause,
    bindparam,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

from outbox import logged, pg_insert
from outbox.config import settings
from outbox.databases import MESSAGE_COLUMNS
from outbox.errors import CaptureNotSetUp
from outbox.idempotency import holder, serialization_conflict
from outbox.prepared import Prepared, chunks, runs
from outbox.schema import message

# The message's bytes with the database's time appended, emitted from a bind (one message) or
# from an array's element (many). Built from constants alone: nothing here comes from input.
_EMITTED = (
    f"pg_logical_emit_message(true, '{logged.PREFIX}', "
    f"CAST(:message AS bytea) || {logged.STAMP_SQL})"
)
# FROM: the row that comes back has no column to describe or convert (some 15% less of the
# client's CPU for the statement than the function in the select list).
_EMIT = text("SELECT FROM " + _EMITTED)
# enqueue_many: one statement a chunk, the messages unnested in the list's order. A volatile
# function in the select list runs after the ORDER BY (PostgreSQL evaluates it in output order),
# so the log holds them as the list orders them.
_EMIT_MANY = text(
    f"SELECT pg_logical_emit_message(true, '{logged.PREFIX}', t.m || {logged.STAMP_SQL}) "  # noqa: S608
    "FROM unnest(CAST(:messages AS bytea[])) WITH ORDINALITY AS t(m, n) ORDER BY t.n"
)
# Is the relay's slot there, in this database? The database named for the error.
_SLOT = text(
    "SELECT current_database(), EXISTS (SELECT FROM pg_replication_slots "
    "WHERE slot_name = :slot AND database = current_database())"
)


@functools.cache
def _held() -> Select[Any]:
    """The held row and its message, in one statement: the table's INSERT (ON CONFLICT on the
    idempotency key, as enqueue's), with `available_at = HELD_UNTIL`, and the message emitted
    for the row it returns (none when the key is taken). RETURNING names the id alone, which
    the application role may read (relay/store/grants.py)."""
    values: dict[str, Any] = {name: bindparam(name) for name in MESSAGE_COLUMNS}
    values["created_at"] = func.statement_timestamp()
    values["available_at"] = literal_column(f"CAST('{logged.HELD_UNTIL}' AS timestamptz)")
    row = (
        postgresql.insert(message)
        .values(values)
        .on_conflict_do_nothing(
            index_elements=["idempotency_key"], index_where=message.c.idempotency_key.isnot(None)
        )
        .returning(message.c.id)
        .cte("held")
    )
    return select(text(_EMITTED)).select_from(row)


def write(conn: Connection, prepared: Prepared) -> uuid.UUID:
    """Emit `prepared` on `conn`, a PostgreSQL connection, in its transaction (with its held row
    if it needs one); its id, or the id of the message holding its idempotency key."""
    check_slot(conn)
    if _needs_row(prepared):
        return _write_held(conn, prepared)
    packed = logged.pack(prepared.params, delay=None, has_row=False)
    _run(conn, "emit", _EMIT, {"message": packed}).close()
    return prepared.id


def write_many(conn: Connection, prepared: Sequence[Prepared]) -> list[uuid.UUID]:
    """`write` for many, in their order: the messages without a row a chunk a statement, each
    with a held row by its own statement at its place in the list."""
    check_slot(conn)
    ids: list[uuid.UUID] = []
    for run in runs(prepared, _needs_row):
        if _needs_row(run[0]):  # a run of one
            ids.append(_write_held(conn, run[0]))
            continue
        for chunk in chunks(run, pg_insert.CHUNK_ROWS, pg_insert.CHUNK_BYTES):
            packed = [logged.pack(one.params, delay=None, has_row=False) for one in chunk]
            _run(conn, "emit_many", _EMIT_MANY, {"messages": packed}).close()
        ids.extend(one.id for one in run)
    return ids


def _needs_row(prepared: Prepared) -> bool:
    return prepared.idempotency_key is not None or prepared.wait is not None


def _write_held(conn: Connection, prepared: Prepared) -> uuid.UUID:
    packed = logged.pack(prepared.params, delay=prepared.wait, has_row=True)
    key = prepared.idempotency_key
    try:
        if _direct(conn):
            params = {**pg_insert.driver_values(prepared), "idempotency_key": key}
        else:
            params = dict(prepared.params)
        params["message"] = packed
        inserted = _run(conn, "held", _held(), params).first() is not None
    except DBAPIError as exc:
        conflict = None if key is None else serialization_conflict(exc, key)
        if conflict is not None:
            raise conflict from exc
        raise
    if inserted:
        return prepared.id
    assert key is not None  # only a taken idempotency key leaves the INSERT without a row
    return holder(conn, key)


def _direct(conn: Connection) -> bool:
    """Whether the statements go as the driver's own SQL on `conn` (else through Core)."""
    return conn.dialect.driver in pg_insert.DRIVERS and "schema_translate_map" not in (
        conn.get_execution_options()
    )


_RENDERED: dict[tuple[str, type[Dialect], str], tuple[str, tuple[str, ...] | None]] = {}


def _run(
    conn: Connection, name: str, statement: Select[Any] | TextClause, params: Mapping[str, Any]
) -> CursorResult[Any]:
    """Run `statement` (named `name`) with `params`: as the driver's SQL, compiled on first use
    per driver and paramstyle, where `_direct`; through Core elsewhere."""
    if not _direct(conn):
        return conn.execute(statement, params)
    dialect = conn.dialect
    key = (name, type(dialect), dialect.paramstyle)
    found = _RENDERED.get(key)
    if found is None:
        compiled = statement.compile(dialect=dialect)
        order = (
            tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
        )
        found = _RENDERED[key] = (compiled.string, order)
    sql, order = found
    if order is None:
        return conn.exec_driver_sql(sql, params)
    return conn.exec_driver_sql(sql, tuple(params[n] for n in order))


# (database, slot) where the slot was found: checked once per process. And the database of each
# driver connection seen, so a call on a known connection asks the driver nothing.
_ready: set[tuple[Hashable, str]] = set()
_databases: weakref.WeakKeyDictionary[Any, Hashable | None] = weakref.WeakKeyDictionary()


def check_slot(conn: Connection) -> None:
    """Raise CaptureNotSetUp unless the configured slot exists in `conn`'s database (asked once
    per process and database, when the driver tells which database it is on)."""
    slot = settings().capture_slot
    where = _database(conn)
    if where is not None and (where, slot) in _ready:
        return
    database, found = conn.execute(_SLOT, {"slot": slot}).one()
    if not found:
        raise CaptureNotSetUp(
            f"logical capture is on, and database {database!r} has "
            f"no replication slot {slot!r}: PostgreSQL would keep the messages for no one, "
            "and they would be lost. Nothing was written. Create the slot with `outbox-relay "
            "capture setup` (or name the relay's with OUTBOX_CAPTURE_SLOT), or enqueue into "
            "the table: outbox.configure(capture='table')"
        )
    if where is not None:
        _ready.add((where, slot))


def _database(conn: Connection) -> Hashable | None:
    """Which database `conn` is on, remembered per driver connection where it can be (asyncpg's
    pool proxies cannot be weakly referenced: asked each time)."""
    raw = conn.connection.driver_connection
    try:
        return _databases[raw]
    except KeyError:
        where = _databases[raw] = _named(raw, conn)
        return where
    except TypeError:
        return _named(raw, conn)


def _named(raw: Any, conn: Connection) -> Hashable | None:
    """Which database `raw` is on, from what the driver knows without a round trip: libpq's
    host, port and name (psycopg 3, psycopg2), asyncpg's address and parameters, or else the
    engine's URL; None when none of them names it."""
    info = getattr(raw, "info", None)
    if info is not None and hasattr(info, "dbname"):
        return (info.host, info.port, info.dbname)
    address, params = getattr(raw, "_addr", None), getattr(raw, "_params", None)
    if address is not None and params is not None:
        return (str(address), params.database)
    url = conn.engine.url
    return (url.host, url.port, url.database) if url.database else None
