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
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import Connection, Interval, bindparam, func, insert, literal_column
from sqlalchemy.engine import Dialect

from outbox.prepared import Prepared
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
        statement = statement.returning(
            func.pg_notify(literal_column(f"'{NOTIFY_CHANNEL}'"), literal_column("''"))
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


def insert_message(conn: Connection, prepared: Prepared, *, notify: bool) -> None:
    """INSERT `prepared` (see `covers`); with `notify`, the relay is notified at commit."""
    rendered = _rendered(conn.dialect, notify)
    given = prepared.params
    params = {name: given[name] for name in _COLUMNS}
    params["id"] = str(params["id"])
    headers = params["headers"]
    # json.dumps as Core's JSON type calls it: the same text either way.
    params["headers"] = _NO_HEADERS if headers is None else json.dumps(headers)
    params["delay"] = prepared.wait or _ZERO
    if rendered.order is None:
        conn.exec_driver_sql(rendered.sql, params).close()
    else:
        conn.exec_driver_sql(rendered.sql, tuple(params[n] for n in rendered.order)).close()
