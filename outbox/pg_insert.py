"""`enqueue`'s INSERT on PostgreSQL, sent as the driver's own SQL: the common path, made cheap.

SQLAlchemy Core spends about as much CPU on an INSERT of this width as the driver and the round
trip do (the statement's cache key, its bind processors, its result set-up). The statement here
is Core's own, compiled once per driver and paramstyle, then run with `exec_driver_sql`:
SQLAlchemy still runs it on the caller's connection, in the caller's transaction, with the
cursor events that instrumentation listens to. Values are passed in forms every supported
driver takes (psycopg 3, psycopg2, asyncpg): the id as text and the headers as JSON text, each
cast by the statement.

The NOTIFY that wakes the relay rides on the same statement (`RETURNING pg_notify(...)`): no
round trip of its own. RETURNING names no column, so the application role needs no SELECT.
Anything this path does not cover (an idempotency key, another driver, a schema translate map)
takes Core's path in outbox/enqueue.py.

`enqueue_many` sends many rows in one statement (`insert_messages`): one array per column,
unnested in the list's order, so rows are written, and numbered by `seq`, as the list orders them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Interval, bindparam, func, insert, literal_column
from sqlalchemy.engine import Dialect

from outbox.prepared import Prepared, chunks
from outbox.schema import message

NOTIFY_CHANNEL = "outbox_relay"
# Drivers whose binds take the values below as they are (tests/integration: each one).
DRIVERS = frozenset({"psycopg", "psycopg2", "asyncpg", "psycopg_async"})
_COLUMNS = (
    "id", "exchange", "routing_key", "payload", "content_type", "headers", "key",
    "priority", "max_attempts", "traceparent", "tracestate",
)  # fmt: skip
_ZERO = dt.timedelta(0)
# What Core's JSON type writes for no headers (JSON null, not SQL NULL): both paths agree.
_NO_HEADERS = "null"


class _Rendered:
    """The statement as this driver's SQL, and how to lay out its parameters."""

    __slots__ = ("order", "sql")

    def __init__(self, sql: str, order: tuple[str, ...] | None) -> None:
        self.sql = sql
        self.order = order  # names in position order (positional paramstyles), else None


_RENDERED: dict[tuple[type[Dialect], str, bool], _Rendered] = {}


def _rendered(dialect: Dialect, notify: bool) -> _Rendered:
    """Compiled on first use per driver, paramstyle and NOTIFY-or-not; a dict read after."""
    key = (type(dialect), dialect.paramstyle, notify)
    found = _RENDERED.get(key)
    if found is not None:
        return found
    values: dict[str, Any] = {name: bindparam(name) for name in _COLUMNS}
    now = func.statement_timestamp()  # the database's clock, the one the relay reads
    values["created_at"] = now
    values["available_at"] = now + bindparam("delay", type_=Interval())
    # inline(): no RETURNING of the new seq (the application role may not read it).
    statement = insert(message).values(values).inline()
    if notify:
        # The payload names the table written (its oid, found as the INSERT finds it, by the
        # search_path; no privilege needed, where `tableoid` would need SELECT): a relay serving
        # another schema of this database, which LISTENs on the same channel, sleeps on.
        oid = f"'{message.fullname}'::regclass::oid::text"
        statement = statement.returning(
            func.pg_notify(literal_column(f"'{NOTIFY_CHANNEL}'"), literal_column(oid))
        )
    compiled = statement.compile(dialect=dialect)
    order = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
    found = _RENDERED[key] = _Rendered(compiled.string, order)
    return found


def covers(conn: Connection, prepared: Prepared) -> bool:
    """Whether this path can write `prepared` on `conn`, a PostgreSQL connection (else Core's
    path does)."""
    dialect = conn.dialect
    return (
        prepared.idempotency_key is None
        and dialect.driver in DRIVERS
        # A map would rename the table at execution, which driver SQL does not go through.
        and "schema_translate_map" not in conn.get_execution_options()
    )


def covers_all(conn: Connection) -> bool:
    """Whether `insert_messages` can write on `conn`, a PostgreSQL connection."""
    return conn.dialect.driver in DRIVERS and "schema_translate_map" not in (
        conn.get_execution_options()
    )


def driver_values(prepared: Prepared) -> dict[str, Any]:
    """The bind values of `prepared`'s row, by name, in the forms every driver in DRIVERS takes."""
    given = prepared.params
    headers = given["headers"]
    return {
        "id": str(prepared.id),
        "exchange": given["exchange"],
        "routing_key": given["routing_key"],
        "payload": given["payload"],
        "content_type": given["content_type"],
        # json.dumps as Core's JSON type calls it: the same text either way.
        "headers": _NO_HEADERS if headers is None else json.dumps(headers),
        "key": given["key"],
        "priority": given["priority"],
        "max_attempts": given["max_attempts"],
        "traceparent": given["traceparent"],
        "tracestate": given["tracestate"],
        "delay": prepared.wait or _ZERO,
    }


def insert_message(conn: Connection, prepared: Prepared, *, notify: bool) -> None:
    """INSERT `prepared` (see `covers`); with `notify`, the relay is notified at commit."""
    rendered = _rendered(conn.dialect, notify)
    params = driver_values(prepared)
    if rendered.order is None:
        conn.exec_driver_sql(rendered.sql, params).close()
    else:
        conn.exec_driver_sql(rendered.sql, tuple(params[n] for n in rendered.order)).close()


# Rows per statement at most: past a thousand, a larger statement saves no measurable time, and
# holds more of the list's encoded values in memory at once. And bytes of payloads and headers
# per statement at most: each array is one value, which PostgreSQL caps at 1 GB.
CHUNK_ROWS = 1_000
CHUNK_BYTES = 16 << 20
# enqueue_many's INSERT: one array per column, unnested in the list's order. One parameter per
# column whatever the number of rows (no driver's limit on parameters is near), and one text for
# every batch, which psycopg and asyncpg prepare once. ORDER BY the ordinality: the identity
# (`seq`) numbers the rows as the list orders them, so one key's messages keep their order.
# `headers` arrives as JSON text, as `insert_message` sends it, and is cast per row.
_MANY_SQL = (
    "INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, headers, key, "
    "priority, max_attempts, traceparent, tracestate, created_at, available_at) "
    "SELECT m.id, m.exchange, m.routing_key, m.payload, m.content_type, m.headers::json, m.key, "
    "m.priority, m.max_attempts, m.traceparent, m.tracestate, statement_timestamp(), "
    "statement_timestamp() + m.delay "
    "FROM unnest({id}::uuid[], {exchange}::text[], {routing_key}::text[], {payload}::bytea[], "
    "{content_type}::text[], {headers}::text[], {key}::text[], {priority}::integer[], "
    "{max_attempts}::integer[], {traceparent}::text[], {tracestate}::text[], "
    "{delay}::interval[]) WITH ORDINALITY "
    "AS m(id, exchange, routing_key, payload, content_type, headers, key, priority, "
    "max_attempts, traceparent, tracestate, delay, n) "
    "ORDER BY m.n"
)
_MANY_ORDER = (*_COLUMNS, "delay")


# psycopg 3 sends these arrays in binary (%b: what its C dumpers write fastest, UUIDs as 16
# bytes); psycopg2 has text alone, and binds the ids as text (an adapter for UUID is not
# everywhere registered).
_BINARY = frozenset({"psycopg", "psycopg_async"})
_TEXT_IDS = frozenset({"psycopg2"})


def _many_sql(dialect: Dialect) -> str:
    """`_MANY_SQL` in the driver's placeholders."""
    if dialect.paramstyle == "numeric_dollar":  # asyncpg
        names = {name: f"${n}" for n, name in enumerate(_MANY_ORDER, 1)}
    else:
        kind = "b" if dialect.driver in _BINARY else "s"
        names = {name: f"%({name}){kind}" for name in _MANY_ORDER}
    return _MANY_SQL.format(**names)


_MANY: dict[tuple[type[Dialect], str], str] = {}


def _arrays(chunk: Sequence[Prepared], text_ids: bool) -> dict[str, list[Any]]:
    """`chunk`'s bind values, one list per column."""
    given = [one.params for one in chunk]
    arrays = {name: [params[name] for params in given] for name in _COLUMNS}
    if text_ids:
        arrays["id"] = [str(one) for one in arrays["id"]]
    # json.dumps as Core's JSON type calls it: the same text as `insert_message` sends.
    arrays["headers"] = [
        _NO_HEADERS if headers is None else json.dumps(headers) for headers in arrays["headers"]
    ]
    arrays["delay"] = [one.wait or _ZERO for one in chunk]
    return arrays


def insert_messages(conn: Connection, prepared: Sequence[Prepared]) -> None:
    """INSERT every one of `prepared` (none with an idempotency key; see `covers_all`), in their
    order, a chunk (CHUNK_ROWS, CHUNK_BYTES) a statement."""
    dialect = conn.dialect
    key = (type(dialect), dialect.paramstyle)
    sql = _MANY.get(key)
    if sql is None:
        sql = _MANY[key] = _many_sql(dialect)
    positional = dialect.paramstyle == "numeric_dollar"
    text_ids = dialect.driver in _TEXT_IDS
    for chunk in chunks(prepared, CHUNK_ROWS, CHUNK_BYTES):
        arrays = _arrays(chunk, text_ids)
        if positional:
            conn.exec_driver_sql(sql, tuple(arrays[name] for name in _MANY_ORDER)).close()
        else:
            conn.exec_driver_sql(sql, arrays).close()
