"""Driver errors of outbox.django's statements, raised as Django raises them for its own queries.

`outbox.django` writes through SQLAlchemy on Django's connection, so a failed statement comes back
as a SQLAlchemy error, which `except django.db.DatabaseError` would not catch. Here it becomes the
`django.db` exception of the same PEP 249 name (InternalError, IntegrityError, OperationalError,
...), raised `from` SQLAlchemy's, with the driver's message: what Django's own cursor would raise
for the same failure. One place, around each call (as Django's `DatabaseErrorWrapper` is around
each of its queries).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import utils  # type: ignore[import-untyped]
from sqlalchemy.exc import DBAPIError

from outbox.dberrors import sqlstate_of

# django.db's exceptions, most specific first: a SQLAlchemy error maps to the first its class
# (or a base) is named after. InterfaceError is not a DatabaseError, in Django as in PEP 249.
_NAMES = (
    "DataError",
    "OperationalError",
    "IntegrityError",
    "InternalError",
    "ProgrammingError",
    "NotSupportedError",
    "InterfaceError",
    "DatabaseError",
)

# PostgreSQL's in_failed_sql_transaction: an earlier statement of the block failed.
_ABORTED = "25P02"


@contextmanager
def django_errors(wrapper: Any, *, call: str) -> Iterator[None]:
    """Raise a SQLAlchemy driver error of the block as `django.db`'s exception of that kind.

    Args:
        wrapper: Django's connection (`django.db.connections[alias]`) the block ran on.
        call: The public call, named in the message.
    """
    try:
        yield
    except DBAPIError as exc:
        raise as_django_error(exc, wrapper, call=call) from exc


def as_django_error(exc: DBAPIError, wrapper: Any, *, call: str) -> Exception:
    """The `django.db` exception for `exc`, with the driver's message (not SQLAlchemy's, which
    adds the statement and a link). As Django's cursor does, any error but bad data or a broken
    constraint marks the connection for a health check before Django reuses it."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    name = next((n for n in _NAMES if n in names), "DatabaseError")
    if name not in ("DataError", "IntegrityError"):
        wrapper.errors_occurred = True
    message = f"{call}: {str(exc.orig).strip()}"
    if sqlstate_of(exc.orig) == _ABORTED:
        message += (
            " (a statement before it in this atomic block failed and its error was caught "
            "without a savepoint: wrap a statement that may fail in a `transaction.atomic()` "
            "of its own, which rolls back only that statement)"
        )
    error: Exception = getattr(utils, name)(message)
    return error
