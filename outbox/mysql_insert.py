"""`enqueue_many`'s INSERT on MySQL and MariaDB: one statement of many VALUES tuples per chunk.

The drivers' executemany would send one INSERT per row here: PyMySQL rewrites an executemany into
one multi-row statement only when the VALUES tuple holds bare placeholders, and this one stamps
the times with the server's clock. So the statement is `enqueue`'s own (outbox/databases.py),
compiled once per driver, its VALUES tuple repeated once per row. The values are bound as Core
binds them there: the id as its 32 hex digits, the headers as JSON text. The rows are written,
and numbered by `seq`, in the list's order.

A chunk holds at most CHUNK_ROWS messages and CHUNK_BYTES of payloads and headers, so that the
statement stays under the server's max_allowed_packet (16 MiB by default on MariaDB) with every
byte escaped; a message larger than that goes alone, as `enqueue` would send it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Insert
from sqlalchemy.engine import Dialect

from outbox.prepared import Prepared, chunks

# Drivers that bind the values below as they are, with %s placeholders and a tuple
# (tests/integration), whichever of format and pyformat the dialect was made with.
DRIVERS = frozenset({"pymysql", "asyncmy"})
CHUNK_ROWS = 1_000
CHUNK_BYTES = 4 << 20
_ZERO = dt.timedelta(0)
_MICROSECOND = dt.timedelta(microseconds=1)
_PYFORMAT = re.compile(r"%\((\w+)\)s")


class _Rows:
    """The one-row statement split for repeating: up to VALUES, its tuple, and the names of the
    values in placeholder order."""

    __slots__ = ("head", "order", "row")

    def __init__(self, statement: Insert, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        head, row = compiled.string.split(" VALUES ", 1)
        self.head = head + " VALUES "
        if compiled.positional:
            self.order = tuple(compiled.positiontup or ())
        else:  # pyformat: %(name)s, which the drivers here take as %s with a tuple
            self.order = tuple(_PYFORMAT.findall(row))
            row = _PYFORMAT.sub("%s", row)
        self.row = row


_ROWS: dict[tuple[type[Dialect], str], _Rows] = {}


def covers_all(conn: Connection) -> bool:
    """Whether `insert_messages` can write on `conn`, a MySQL or MariaDB connection."""
    dialect = conn.dialect
    return (
        dialect.driver in DRIVERS
        and dialect.paramstyle in ("format", "pyformat")
        and "schema_translate_map" not in conn.get_execution_options()
    )


def _value(name: str, one: Prepared) -> Any:
    if name == "id":
        return one.id.hex
    if name == "headers":
        headers = one.params["headers"]
        return "null" if headers is None else json.dumps(headers)  # as Core's JSON type writes
    if name == "delay_us":
        return (one.wait or _ZERO) // _MICROSECOND
    return one.params[name]


def insert_messages(conn: Connection, statement: Insert, prepared: Sequence[Prepared]) -> None:
    """INSERT every one of `prepared` (none with an idempotency key; see `covers_all`) with
    `statement`'s VALUES, in their order, a chunk a statement."""
    dialect = conn.dialect
    key = (type(dialect), dialect.paramstyle)
    rows = _ROWS.get(key)
    if rows is None:
        rows = _ROWS[key] = _Rows(statement, dialect)
    for chunk in chunks(prepared, CHUNK_ROWS, CHUNK_BYTES):
        params = [_value(name, one) for one in chunk for name in rows.order]
        sql = rows.head + ", ".join([rows.row] * len(chunk))
        conn.exec_driver_sql(sql, tuple(params)).close()
