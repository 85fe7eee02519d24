"""The connection a call writes or reads with, whatever handle the caller has: a SQLAlchemy Session,
scoped_session or Connection, or a plain DB-API connection (psycopg 3, psycopg2, sqlite3,
PyMySQL), lent to SQLAlchemy for the call (outbox/borrowed.py). Anything else gets an error naming
what was passed and what to pass instead (the async call for an async handle).

`sqlalchemy.ext.asyncio` is never imported here: an object can only be one of its classes once
the application has imported it, so it is looked up in `sys.modules`. The async handles are
resolved in outbox/async_enqueue.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from outbox.errors import InvalidSession
from outbox.plain import DBAPIConnection, driver_of, refuse_autocommit

# What the sync calls take, as a type checker sees it.
Db = Session | scoped_session[Any] | Connection | DBAPIConnection

SYNC_KINDS = (
    "a SQLAlchemy Session or Connection (a scoped_session too), or a DB-API connection "
    "(psycopg, psycopg2, sqlite3, PyMySQL)"
)
ASYNC_KINDS = (
    "a SQLAlchemy AsyncSession or AsyncConnection (an async_scoped_session too), or an asyncpg "
    "connection or psycopg AsyncConnection"
)


def sync_connection(
    db: object, *, call: str, async_call: str, writes: bool
) -> AbstractContextManager[Connection]:
    """`db`'s connection, for a `with` block: a Session's (or a scoped_session's current
    Session's) joins its transaction without flushing the caller's objects, a Connection is used
    as it is, a DB-API connection is lent in its current transaction. Anything else raises
    `InvalidSession`; when `writes`, a DB-API connection in autocommit mode raises
    `NotInTransaction`. Both before anything is done on `db`."""
    if isinstance(db, Session | scoped_session):
        return _session_connection(db)
    if isinstance(db, Connection):
        return nullcontext(db)
    driver = driver_of(db)
    if driver is None or driver.is_async:
        raise wrong_object(db, call=call, other_call=async_call, wants_async=False)
    if writes:
        refuse_autocommit(db, driver, call=call)
    from outbox.borrowed import lend  # only an application on plain connections loads it

    return lend(db, driver)


@contextmanager
def _session_connection(session: Session | scoped_session[Any]) -> Iterator[Connection]:
    yield session.connection()


def wrong_object(db: object, *, call: str, other_call: str, wants_async: bool) -> InvalidSession:
    """The error for `call(db, ...)` when `db` is not what it takes; `other_call` is the
    function for the other kind (sync or async) of handle."""
    name = _a(public_name(type(db)))
    if wants_async and _is_sync_handle(db):
        return InvalidSession(
            f"{call} was given {name}, which is synchronous: use `{other_call}(...)` "
            "(no await) with it"
        )
    if not wants_async and _is_async_handle(db):
        return InvalidSession(f"{call} was given {name}: use `await {other_call}(...)` with it")
    expected = ASYNC_KINDS if wants_async else SYNC_KINDS
    return InvalidSession(f"{call} needs {expected} inside your transaction, not {name}{_hint(db)}")


def _hint(db: object) -> str:
    module = type(db).__module__
    if isinstance(db, Engine) or _is_async(db, "AsyncEngine"):
        return " (an engine is not a transaction: pass the session or connection it runs in)"
    if isinstance(db, sessionmaker) or _is_async(db, "async_sessionmaker"):
        return " (a sessionmaker makes sessions: pass the session it made, inside its transaction)"
    if module.startswith("django."):
        return " (with Django, call outbox.django's functions: they use Django's connection)"
    if "cursor" in type(db).__name__.lower():
        return " (a cursor: pass the connection it belongs to)"
    if "pool" in type(db).__name__.lower():
        return " (a pool: pass a connection it lent you, inside your transaction)"
    return ""


def _is_sync_handle(db: object) -> bool:
    if isinstance(db, Session | scoped_session | Connection):
        return True
    driver = driver_of(db)
    return driver is not None and not driver.is_async


def _is_async_handle(db: object) -> bool:
    if any(_is_async(db, name) for name in _ASYNC_HANDLES):
        return True
    driver = driver_of(db)
    return driver is not None and driver.is_async


_ASYNC_HANDLES = ("AsyncSession", "AsyncConnection", "async_scoped_session")


def _is_async(db: object, name: str) -> bool:
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    return module is not None and isinstance(db, getattr(module, name))


def public_name(cls: type) -> str:
    """`cls` as its package exports it (`psycopg.Cursor`, `sqlalchemy.Engine`; `str` for a
    builtin): the shortest parent module that holds it under its name."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    parts = cls.__module__.split(".")
    for end in range(1, len(parts)):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None and getattr(module, cls.__qualname__, None) is cls:
            return f"{'.'.join(parts[:end])}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _a(name: str) -> str:
    return f"an {name}" if name and name[0].lower() in "aeiou" else f"a {name}"
