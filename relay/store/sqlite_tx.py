"""One SQLite write transaction on a connection whose engine runs in autocommit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection


@contextmanager
def sqlite_transaction(conn: Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE takes the write lock up front, so the statements inside see and change
    the same rows, and a writer never fails upgrading a read lock against a busy relay."""
    conn.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.exec_driver_sql("ROLLBACK")
        raise
    conn.exec_driver_sql("COMMIT")
