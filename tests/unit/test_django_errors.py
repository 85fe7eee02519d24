"""outbox.django's errors, without a database: SQLAlchemy's driver errors raised as Django's of the
same kind (so `except django.db.DatabaseError` catches them), Django's database errors read by the
consumer's policy as SQLAlchemy's are, and handlers the Django consumer cannot call refused."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.db import utils  # type: ignore[import-untyped]
from sqlalchemy import exc as sa

from outbox.consumer.policy import ConsumerPolicy, Requeue, RetryLater, RunAgain, decide
from outbox.django.consumer import check_handler
from outbox.django.errors import as_django_error
from outbox.errors import InvalidOption


class DriverError(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def sqlalchemy_error(kind: type[sa.DBAPIError], message: str, sqlstate: str | None) -> Any:
    return kind("INSERT INTO outbox_message ...", {}, DriverError(message, sqlstate))


ABORTED = "current transaction is aborted, commands ignored until end of transaction block"


@pytest.mark.parametrize(
    ("kind", "django_kind", "checked"),
    [
        (sa.InternalError, utils.InternalError, True),
        (sa.OperationalError, utils.OperationalError, True),
        (sa.IntegrityError, utils.IntegrityError, False),
        (sa.DataError, utils.DataError, False),
        (sa.ProgrammingError, utils.ProgrammingError, True),
        (sa.DatabaseError, utils.DatabaseError, True),
        (sa.InterfaceError, utils.InterfaceError, True),
    ],
)
def test_a_driver_error_becomes_djangos_of_the_same_kind(
    kind: type[sa.DBAPIError], django_kind: type[Exception], checked: bool
) -> None:
    wrapper = SimpleNamespace(errors_occurred=False)
    error = as_django_error(sqlalchemy_error(kind, "it failed", None), wrapper, call="x.enqueue")
    assert type(error) is django_kind
    assert str(error) == "x.enqueue: it failed"  # the driver's message, not SQLAlchemy's
    # As Django's cursor: bad data and broken constraints leave the connection unchecked.
    assert wrapper.errors_occurred is checked


def test_an_aborted_transaction_says_how_to_avoid_it() -> None:
    wrapper = SimpleNamespace(errors_occurred=False)
    failed = sqlalchemy_error(sa.InternalError, ABORTED, "25P02")
    error = as_django_error(failed, wrapper, call="outbox.django.enqueue")
    assert isinstance(error, utils.DatabaseError)
    assert str(error).startswith(f"outbox.django.enqueue: {ABORTED} (a statement before it")
    assert "`transaction.atomic()` of its own" in str(error)


def django_error(kind: type[Exception], message: str, sqlstate: str | None) -> Exception:
    """A Django database error as its cursor raises it: the driver's error its __cause__."""
    try:
        try:
            raise DriverError(message, sqlstate)
        except DriverError as driver:
            raise kind(message) from driver
    except kind as raised:
        return raised


POLICY = ConsumerPolicy()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (django_error(utils.OperationalError, "server closed the connection", None), Requeue),
        (django_error(utils.InterfaceError, "connection already closed", None), Requeue),
        (django_error(utils.OperationalError, "terminating connection", "57P01"), Requeue),
        (django_error(utils.OperationalError, "deadlock detected", "40P01"), RunAgain),
        (django_error(utils.OperationalError, "could not serialize", "40001"), RunAgain),
        (django_error(utils.IntegrityError, "duplicate key", "23505"), RetryLater),
        (django_error(utils.ProgrammingError, "no such column", "42703"), RetryLater),
        # MySQL: Django's exception carries the driver's args, the error number first.
        (utils.OperationalError(2006, "MySQL server has gone away"), Requeue),
        (utils.OperationalError(1213, "Deadlock found"), RunAgain),
        (ValueError("a handler's own"), RetryLater),
    ],
)
def test_the_policy_reads_djangos_database_errors(error: Exception, expected: type) -> None:
    assert type(decide(error, 1, POLICY)) is expected


def two(a: object, b: object) -> None:
    pass


@pytest.mark.parametrize(
    ("handler", "why"),
    [
        ("shop.handlers.bill", "the handler must be callable, not str"),
        (two, "the handler is called as handler(message), but its parameters are (a, b)"),
    ],
)
def test_a_handler_that_cannot_take_the_message_is_refused(handler: object, why: str) -> None:
    with pytest.raises(InvalidOption) as refused:
        check_handler(handler)
    assert str(refused.value) == why


def test_handlers_that_take_the_message_pass() -> None:
    check_handler(lambda message: None)
    check_handler(lambda *args: None)
    check_handler(print)  # a builtin: nothing to check
