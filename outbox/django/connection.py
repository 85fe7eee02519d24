"""Django's own connection, as the outbox writes and reads with it: the DB-API connection under
Django's wrapper (psycopg 3 or psycopg2, sqlite3, PyMySQL), lent to SQLAlchemy for one call
(outbox/borrowed.py) in the transaction Django has open on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection

from outbox.borrowed import lend
from outbox.errors import NotInTransaction, UnsupportedDatabase
from outbox.plain import driver_of
from outbox.sessions import public_name


def raw_connection(wrapper: Any) -> Any:
    """The DB-API connection of Django's `wrapper` (`django.db.connections[alias]`), opened if
    it was not yet; UnsupportedDatabase when its driver is not one the outbox takes."""
    wrapper.ensure_connection()
    raw = wrapper.connection
    driver = driver_of(raw)
    if driver is None or driver.is_async:
        raise UnsupportedDatabase(
            f"outbox.django writes with Django's postgresql (psycopg 3 or psycopg2), sqlite3 or "
            f"mysql (PyMySQL) connection; the {wrapper.alias!r} database's connection is "
            f"{public_name(type(raw))}"
        )
    return raw


def in_transaction(wrapper: Any, *, call: str) -> Any:
    """`raw_connection(wrapper)`, when Django has a transaction open on it: inside an atomic()
    block, or with autocommit turned off. Outside, Django autocommits each statement, and the
    message would commit alone: NotInTransaction."""
    if not wrapper.in_atomic_block and wrapper.get_autocommit():
        raise NotInTransaction(
            f"{call} runs inside `transaction.atomic()` (on the {wrapper.alias!r} database): "
            "outside it Django autocommits, so the message would commit on its own, whether or "
            "not your changes do"
        )
    # A block whose query failed cannot run more until it is left: Django's own error says so.
    wrapper.validate_no_broken_transaction()
    return raw_connection(wrapper)


@contextmanager
def lent(wrapper: Any) -> Iterator[Connection]:
    """A SQLAlchemy Connection on Django's connection, in whatever state Django has it in."""
    raw = raw_connection(wrapper)
    driver = driver_of(raw)
    assert driver is not None  # raw_connection checked it
    with lend(raw, driver) as conn:
        yield conn
