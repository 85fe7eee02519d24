"""The caller's plain DB-API connection, lent to SQLAlchemy for the length of one call.

The obvious glue, an engine whose `creator` returns the caller's connection, loses data without
an error: SQLAlchemy's first-connect set-up and its pool's reset roll the connection back, and the
caller's transaction with it. Here each driver's dialect is subclassed so that commit, rollback
and close do nothing (the transaction and the connection stay the caller's), and so that no
per-connection set-up runs: nothing (a notice handler, an SQL function, SET NAMES, a type codec)
is added to the caller's connection, and no round trip is spent on it. One engine per driver,
made on first use; the dialect's one-time initialisation (the server's version, a few settings)
runs then, on the caller's connection, in its transaction. NullPool: each call takes the
connection from a context variable and gives nothing back to any pool.

Loaded on the first plain connection: an application on SQLAlchemy sessions never imports it.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, DateTime, Engine, create_engine
from sqlalchemy.dialects import registry, sqlite
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg, PGDialectAsync_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.pool import NullPool
from sqlalchemy.util import LRUCache

from outbox.plain import Driver

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

_lent: ContextVar[Any] = ContextVar("outbox_lent_connection")


class _Borrowing:
    """The caller's connection, transaction and session settings are theirs: no set-up on
    connect, and commit, rollback and close do nothing."""

    supports_statement_cache = True  # SQLAlchemy asks each dialect class to say so itself

    def on_connect(self) -> Any:
        return None

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_close(self, dbapi_connection: Any) -> None:
        pass

    def do_terminate(self, dbapi_connection: Any) -> None:
        pass


class Psycopg(_Borrowing, PGDialect_psycopg):
    supports_statement_cache = True


class Psycopg2(_Borrowing, PGDialect_psycopg2):
    supports_statement_cache = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        # psycopg2 binds a UUID once its adapter is registered, which is process-wide (as any
        # psycopg2 engine of SQLAlchemy's does); the per-connection typecaster is left out, so
        # the caller's own queries keep returning what they did.
        self._psycopg2_extensions.register_adapter(uuid.UUID, self._psycopg2_extras.UUID_adapter)


class _DateTime(sqlite.DATETIME):
    """SQLite's DATETIME, also when the caller's connection parses the column itself (Django
    opens SQLite with PARSE_DECLTYPES and a converter for DATETIME): a datetime passes as it is."""

    def result_processor(self, dialect: Any, coltype: object) -> Any:
        parse = super().result_processor(dialect, coltype)
        if parse is None:
            return None

        def process(value: Any) -> Any:
            return value if isinstance(value, dt.datetime) else parse(value)

        return process


class Pysqlite(_Borrowing, SQLiteDialect_pysqlite):
    supports_statement_cache = True
    colspecs = {**SQLiteDialect_pysqlite.colspecs, DateTime: _DateTime}


class Pymysql(_Borrowing, MySQLDialect_pymysql):
    supports_statement_cache = True


class PsycopgAsync(_Borrowing, PGDialectAsync_psycopg):
    supports_statement_cache = True

    @classmethod
    def get_async_dialect_cls(cls, url: Any) -> Any:
        return cls  # not psycopg's own async dialect, which its base names


# asyncpg's prepared statements belong to the connection: kept with it, not with the adapter
# SQLAlchemy makes per call, so a second call does not prepare the INSERT again.
_asyncpg_statements: weakref.WeakKeyDictionary[Any, LRUCache[Any, Any]] = (
    weakref.WeakKeyDictionary()
)


class Asyncpg(_Borrowing, PGDialect_asyncpg):
    supports_statement_cache = True

    def on_connect(self) -> Any:
        def lend(adapted: Any) -> None:
            # Autocommit, as the adapter calls it: it does not open a transaction of its own
            # (its statements run in the caller's, asyncpg's transaction()).
            adapted.set_isolation_level("autocommit")
            raw = adapted.driver_connection
            cache = _asyncpg_statements.get(raw)
            if cache is None:
                cache = _asyncpg_statements[raw] = LRUCache(100)
            adapted._prepared_statement_cache = cache

        return lend


_DIALECTS: dict[str, tuple[str, str]] = {  # driver -> (backend, the class above)
    "psycopg": ("postgresql", "Psycopg"),
    "psycopg2": ("postgresql", "Psycopg2"),
    "pysqlite": ("sqlite", "Pysqlite"),
    "pymysql": ("mysql", "Pymysql"),
    "psycopg_async": ("postgresql", "PsycopgAsync"),
    "asyncpg": ("postgresql", "Asyncpg"),
}
for _driver, (_backend, _class) in _DIALECTS.items():
    registry.register(f"{_backend}.outbox_{_driver}", __name__, _class)

_engines: dict[str, Any] = {}
_making = threading.Lock()


def _url(driver: Driver) -> str:
    backend = _DIALECTS[driver.name][0]
    return f"{backend}+outbox_{driver.name}://"


def _options(driver: Driver) -> dict[str, Any]:
    options: dict[str, Any] = {"poolclass": NullPool, "pool_reset_on_return": None}
    if driver.name in ("psycopg", "psycopg2"):
        options["use_native_hstore"] = False  # its OID lookup is a query per connection
    return options


def _creator() -> Any:
    return _lent.get()


async def _async_creator() -> Any:
    return _lent.get()


def _engine(driver: Driver) -> Engine:
    engine = _engines.get(driver.name)
    if engine is None:
        with _making:
            engine = _engines.get(driver.name)
            if engine is None:
                engine = create_engine(_url(driver), creator=_creator, **_options(driver))
                _engines[driver.name] = engine
    return engine


def _async_engine(driver: Driver) -> AsyncEngine:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = _engines.get(driver.name)
    if engine is None:
        with _making:
            engine = _engines.get(driver.name)
            if engine is None:
                engine = create_async_engine(
                    _url(driver), async_creator=_async_creator, **_options(driver)
                )
                _engines[driver.name] = engine
    return engine


@contextmanager
def lend(db: Any, driver: Driver) -> Iterator[Connection]:
    """A SQLAlchemy Connection on `db`, in its current transaction, for the `with` block."""
    token = _lent.set(db)
    try:
        conn = _engine(driver).connect()
    finally:
        _lent.reset(token)
    with conn:
        yield conn


@asynccontextmanager
async def lend_async(db: Any, driver: Driver) -> AsyncIterator[AsyncConnection]:
    """A SQLAlchemy AsyncConnection on `db`, in its current transaction, for the block."""
    token = _lent.set(db)
    try:
        conn = await _async_engine(driver).connect()
    finally:
        _lent.reset(token)
    try:
        yield conn
    finally:
        await conn.close()
