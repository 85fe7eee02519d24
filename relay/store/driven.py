"""Running a Driven statement (relay/store/statements.py) on the driver's own cursor.

SQLAlchemy's execution wraps every statement in an execution context and every result row in a
Row; for the claim, which returns hundreds of rows, and the mark, which runs after every burst of
confirms, that costs about 2 us of the relay's CPU per message (`make bench`, 80-byte bodies).
Here the pooled connection's driver cursor runs the text and returns its tuples, and what
SQLAlchemy would do on the way is done where it matters: a driver error is raised as SQLAlchemy
raises it (a DBAPIError, which boundary.translated turns into DatabaseUnavailable), and a
connection the error shows is gone is invalidated in the pool.

A listener of the engine's cursor events (OpenTelemetry's SQLAlchemy instrumentation, a test
reading the statements) still sees these: while one listens, the statement goes through
`exec_driver_sql` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from relay.store.statements import Driven


def run(conn: Connection, statement: Driven, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
    """The rows `statement` returns, bound with `params`."""
    if conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute:
        return conn.exec_driver_sql(statement.pyformat, dict(params)).all()
    pooled = conn.connection
    driver = pooled.driver_connection
    assert driver is not None, "a checked-out connection has its driver connection"
    cursor = driver.cursor()
    try:
        cursor.execute(statement.pyformat, params)
        rows: Sequence[Sequence[Any]] = cursor.fetchall()
        return rows
    except conn.dialect.loaded_dbapi.Error as exc:
        gone = conn.dialect.is_disconnect(exc, pooled.dbapi_connection, cursor)
        if gone:
            conn.invalidate(exc)
        raise DBAPIError.instance(
            statement.pyformat,
            params,
            exc,
            conn.dialect.loaded_dbapi.Error,
            connection_invalidated=gone,
            dialect=conn.dialect,
        ) from exc
    finally:
        cursor.close()
