"""The connection a call writes or reads with, and an error naming the right call when the caller
passed the wrong kind of object (an AsyncSession to `enqueue`, a Session to `enqueue_async`).

`sqlalchemy.ext.asyncio` is never imported here: an object can only be one of its classes once
the application has imported it, so it is looked up in `sys.modules`.
"""

from __future__ import annotations

import sys

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from outbox.errors import InvalidSession

SYNC_KINDS = "a SQLAlchemy Session or Connection"
ASYNC_KINDS = "a SQLAlchemy AsyncSession or AsyncConnection"


def sync_connection(db: object, *, call: str, async_call: str) -> Connection:
    """`db`'s connection: a Session's joins its transaction without flushing the caller's
    objects; a Connection is used as it is. Anything else raises `InvalidSession`."""
    if isinstance(db, Session):
        return db.connection()
    if isinstance(db, Connection):
        return db
    raise wrong_object(db, call=call, other_call=async_call, wants_async=False)


def wrong_object(db: object, *, call: str, other_call: str, wants_async: bool) -> InvalidSession:
    """The error for `call(db, ...)` when `db` is not what it takes; `other_call` is the
    function for the other kind (sync or async) of session."""
    kind = type(db).__name__
    if wants_async and isinstance(db, Session | Connection):
        return InvalidSession(
            f"{call} was given {_a(kind)}, which is synchronous: use `{other_call}(...)` "
            f"(no await) with {SYNC_KINDS}"
        )
    if not wants_async and _is_async_session_or_connection(db):
        return InvalidSession(
            f"{call} was given {_a(kind)}: use `await {other_call}(...)` with {ASYNC_KINDS}"
        )
    expected = ASYNC_KINDS if wants_async else SYNC_KINDS
    message = f"{call} needs {expected} inside your transaction, not {_a(kind)}"
    if isinstance(db, Engine) or _is_async_engine(db):
        message += " (an engine is not a transaction: pass the session or connection it runs in)"
    return InvalidSession(message)


def _asyncio_classes() -> tuple[type, ...]:
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    if module is None:
        return ()
    return (module.AsyncSession, module.AsyncConnection, module.AsyncEngine)


def _is_async_session_or_connection(db: object) -> bool:
    return isinstance(db, _asyncio_classes()[:2])


def _is_async_engine(db: object) -> bool:
    return isinstance(db, _asyncio_classes()[2:])


def _a(name: str) -> str:
    return f"an {name}" if name and name[0].lower() in "aeiou" else f"a {name}"
