"""Plain DB-API connections: which driver's connection an object is, and whether it is inside a
transaction the caller controls.

Drivers are recognised by class name, so none is imported here: an object can only be a
psycopg connection once the application has imported psycopg. A subclass (Django wraps none,
but an application may) is recognised by its bases.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from outbox.errors import NotInTransaction


class DBAPIConnection(Protocol):
    """What a type checker knows of a PEP 249 connection; `driver_of` tells which one it is."""

    def cursor(self, *args: Any, **kwargs: Any) -> Any: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...


class AsyncDBAPIConnection(Protocol):
    """What a type checker knows of asyncpg's and psycopg's async connections."""

    def close(self) -> Awaitable[None]: ...


@dataclass(frozen=True, slots=True)
class Driver:
    """A DB-API driver whose connections `enqueue` takes."""

    name: str  # SQLAlchemy's name for the driver (outbox/borrowed.py: the dialect to lend to)
    label: str  # how a message names its connection class
    is_async: bool
    begin: str  # how to open a transaction on it, for the autocommit refusal


PSYCOPG = Driver(
    "psycopg", "psycopg.Connection", False, "`with conn.transaction():`, or autocommit=False"
)
PSYCOPG2 = Driver("psycopg2", "psycopg2 connection", False, "conn.autocommit = False")
SQLITE = Driver(
    "pysqlite",
    "sqlite3.Connection",
    False,
    "the default isolation_level (not None), or an explicit BEGIN",
)
PYMYSQL = Driver("pymysql", "pymysql.Connection", False, "conn.begin(), or autocommit=False")
ASYNCPG = Driver("asyncpg", "asyncpg.Connection", True, "`async with conn.transaction():`")
PSYCOPG_ASYNC = Driver(
    "psycopg_async",
    "psycopg.AsyncConnection",
    True,
    "`async with conn.transaction():`, or autocommit=False",
)

# (module, class) as the driver defines them -> the driver.
_CLASSES = {
    ("psycopg", "Connection"): PSYCOPG,
    ("psycopg.connection", "Connection"): PSYCOPG,
    ("psycopg2.extensions", "connection"): PSYCOPG2,
    ("sqlite3", "Connection"): SQLITE,
    ("pymysql.connections", "Connection"): PYMYSQL,
    ("asyncpg.connection", "Connection"): ASYNCPG,
    ("asyncpg.pool", "PoolConnectionProxy"): ASYNCPG,  # what a pool's acquire() gives
    ("psycopg", "AsyncConnection"): PSYCOPG_ASYNC,
    ("psycopg.connection_async", "AsyncConnection"): PSYCOPG_ASYNC,
}


def driver_of(db: object) -> Driver | None:
    """The driver whose connection `db` is; None when it is no connection `enqueue` takes."""
    cls = type(db)
    try:
        return _known[cls]
    except KeyError:
        pass
    found = next(
        (d for b in cls.__mro__ if (d := _CLASSES.get((b.__module__, b.__qualname__)))), None
    )
    _known[cls] = found
    return found


_known: dict[type, Driver | None] = {}  # each class looked up once


# libpq's PQTransactionStatus (psycopg 3 and psycopg2 alike): idle, outside a transaction.
_PQ_IDLE = 0
_MYSQL_IN_TRANS = 1  # MySQL's SERVER_STATUS_IN_TRANS flag
_SQLITE_LEGACY = -1  # sqlite3.LEGACY_TRANSACTION_CONTROL: autocommit follows isolation_level


def in_autocommit(db: Any, driver: Driver) -> bool:
    """Whether a statement run on `db` now would commit on its own: autocommit mode, and no
    transaction opened explicitly (psycopg's `transaction()`, a BEGIN). Reads only what the
    driver already knows: no round trip."""
    if driver in (PSYCOPG, PSYCOPG_ASYNC, PSYCOPG2):
        return bool(db.autocommit) and int(db.info.transaction_status) == _PQ_IDLE
    if driver is SQLITE:
        # Python's sqlite3 opens a transaction before DML by itself unless isolation_level is
        # None (or, from Python 3.12, autocommit=True).
        mode = getattr(db, "autocommit", _SQLITE_LEGACY)
        autocommit = db.isolation_level is None if mode == _SQLITE_LEGACY else bool(mode)
        return autocommit and not db.in_transaction
    if driver is PYMYSQL:
        return bool(db.get_autocommit()) and not db.server_status & _MYSQL_IN_TRANS
    if driver is ASYNCPG:  # asyncpg has no other mode: outside transaction() it autocommits
        return not db.is_in_transaction()
    return False


def refuse_autocommit(db: Any, driver: Driver, *, call: str) -> None:
    """Raise `NotInTransaction` when `db` is in autocommit mode outside any transaction."""
    if in_autocommit(db, driver):
        raise NotInTransaction(
            f"{call} was given a {driver.label} in autocommit mode, outside any transaction: the "
            "message would commit on its own, whether or not your business transaction commits. "
            f"Call it inside the transaction that changes your data ({driver.begin})"
        )
