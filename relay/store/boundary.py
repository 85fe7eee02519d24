"""The one place driver errors become the relay's: DatabaseUnavailable when waiting may help,
SchemaNotFound when the tables are missing, PermissionDenied when a grant is missing.

SqlStore runs every statement behind `translated`, and so do the operator commands
(engines.command_engine) and the console."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from outbox.dberrors import sqlstate_of
from outbox.schema import is_missing_table
from relay.errors import DatabaseUnavailable, PermissionDenied, RelayError, SchemaNotFound
from relay.store.databases import DIALECTS, shown


def translate_db_error(engine: Engine, exc: DBAPIError) -> RelayError | None:
    """The relay's error for a driver error, or None when it should propagate as it is.

    Transient errors (connection lost or refused, server starting or shutting down, serialization
    failure, deadlock; each dialect says which, PostgreSQL by SQLSTATE, never by message text)
    become DatabaseUnavailable, which the relay loop waits out and retries; anything else is a
    bug or a broken schema and propagates.
    """
    if is_missing_table(exc):
        where = shown(engine.url)
        return SchemaNotFound(
            f"the outbox tables do not exist in {where}: run `outbox-relay migrate`"
        )
    if sqlstate_of(exc.orig) == "42501":  # insufficient_privilege
        # A role without a grant it needs (relay/store/grants.py); the CLI names which.
        return PermissionDenied(first_line(exc))
    if DIALECTS[engine.dialect.name].is_transient(exc) or exc.connection_invalidated:
        return DatabaseUnavailable(_describe(engine, exc))
    return None


@contextmanager
def translated(engine: Engine) -> Iterator[None]:
    """Run a block against `engine` with its driver errors translated (translate_db_error)."""
    try:
        yield
    except DBAPIError as exc:
        relay_error = translate_db_error(engine, exc)
        if relay_error is not None:
            raise relay_error from exc
        raise
    except PoolTimeout as exc:
        # Every pooled connection busy past the pool's timeout: the database is slow, not the
        # statement wrong; the loop waits and retries as for an outage.
        where = shown(engine.url)
        raise DatabaseUnavailable(f"database {where}: no free connection ({exc})") from exc


def first_line(exc: SQLAlchemyError) -> str:
    """The driver's message of an error, its first line."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _describe(engine: Engine, exc: DBAPIError) -> str:
    first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    sqlstate = sqlstate_of(exc.orig)
    what = "is not reachable" if sqlstate is None or sqlstate.startswith("08") else "failed"
    return f"database {shown(engine.url)} {what}: {first}"
