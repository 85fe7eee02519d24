"""MySQL and MariaDB errors told apart by their number (read as the SQLSTATE of the same
condition), with PyMySQL's real exception classes; a database the outbox does not run on refused
before any SQL; and no LISTEN attempted where there is no NOTIFY."""

from __future__ import annotations

from typing import Any, cast

import pymysql.err
import pytest
from sqlalchemy import Connection, create_mock_engine
from sqlalchemy.exc import DBAPIError

import outbox
from outbox.dberrors import DbFailure, classify_db_error, is_conflict, sqlstate_of
from outbox.enqueue import write
from outbox.errors import UnsupportedDatabase
from outbox.prepared import prepare
from outbox.schema import is_missing_table
from relay.runtime.wakeup import listener_for
from relay.store.mysql import Mysql


@pytest.mark.parametrize(
    ("error", "sqlstate", "failure"),
    [
        (pymysql.err.OperationalError(1213, "Deadlock found"), "40P01", DbFailure.TRANSIENT),
        (pymysql.err.OperationalError(1205, "Lock wait timeout"), "55P03", DbFailure.TRANSIENT),
        (pymysql.err.OperationalError(2006, "Server has gone away"), "08006", DbFailure.TRANSIENT),
        (pymysql.err.OperationalError(2013, "Lost connection"), "08006", DbFailure.TRANSIENT),
        (pymysql.err.OperationalError(2003, "Can't connect"), "08001", DbFailure.TRANSIENT),
        (pymysql.err.OperationalError(1969, "max_statement_time"), "57014", DbFailure.TRANSIENT),
        (pymysql.err.OperationalError(1290, "--read-only"), "25006", DbFailure.TRANSIENT),
        (pymysql.err.OperationalError(1040, "Too many connections"), "53300", DbFailure.TRANSIENT),
        (pymysql.err.InterfaceError(0, ""), None, DbFailure.TRANSIENT),  # the connection is gone
        (pymysql.err.IntegrityError(1062, "Duplicate entry"), "23505", DbFailure.PERMANENT),
        (pymysql.err.OperationalError(1142, "command denied"), "42501", DbFailure.PERMANENT),
        (pymysql.err.OperationalError(1044, "Access denied"), "42501", DbFailure.PERMANENT),
        (pymysql.err.ProgrammingError(1146, "doesn't exist"), "42P01", DbFailure.PERMANENT),
        (pymysql.err.ProgrammingError(1064, "syntax"), "42601", DbFailure.PERMANENT),
        (pymysql.err.OperationalError(1099, "unlisted"), "HY000", DbFailure.PERMANENT),
    ],
)
def test_mysql_errors_by_number(error: Exception, sqlstate: str | None, failure: DbFailure) -> None:
    assert sqlstate_of(error) == sqlstate
    assert classify_db_error(sqlstate_of(error)) is failure
    wrapped = DBAPIError("statement", {}, error)
    assert Mysql.is_transient(wrapped) is (failure is DbFailure.TRANSIENT)


def test_pymysqls_own_sqlstate_is_not_mistaken_for_postgresqls() -> None:
    # PyMySQL reports the server's SQLSTATE too: 40001 for a deadlock, 23000 for any
    # integrity error. The number is what tells them apart.
    deadlock = pymysql.err.OperationalError(1213, "Deadlock found", sqlstate="40001")
    assert sqlstate_of(deadlock) == "40P01"
    assert is_conflict(sqlstate_of(deadlock))
    assert not is_conflict(sqlstate_of(pymysql.err.OperationalError(1205, "Lock wait")))


def test_a_missing_table_is_told_by_number() -> None:
    error = pymysql.err.ProgrammingError(1146, "Table 'db.outbox_message' doesn't exist")
    assert is_missing_table(DBAPIError("SELECT 1", {}, error))


def test_other_drivers_keep_their_sqlstate() -> None:
    class Psycopg(Exception):
        sqlstate = "40P01"

    class Psycopg2(Exception):
        pgcode = "42P01"

    assert sqlstate_of(Psycopg("deadlock detected")) == "40P01"
    assert sqlstate_of(Psycopg2("relation does not exist")) == "42P01"
    assert sqlstate_of(ValueError("sqlite: database is locked")) is None


# --------------------------------------------------------------------------- unsupported


def never_run(sql: Any, *args: Any, **kwargs: Any) -> None:
    raise AssertionError(f"no SQL may run on an unsupported database: {sql}")


def test_create_schema_refuses_a_database_it_does_not_run_on_before_any_sql() -> None:
    oracle = create_mock_engine("oracle://", never_run)
    wanted = "runs on PostgreSQL, MySQL/MariaDB and SQLite, not oracle"
    with pytest.raises(UnsupportedDatabase, match=wanted):
        outbox.create_schema(cast(Any, oracle))


def test_enqueue_refuses_a_database_it_does_not_run_on_before_any_sql() -> None:
    mssql = create_mock_engine("mssql://", never_run)
    prepared = prepare(
        exchange="orders",
        routing_key="r",
        payload={"n": 1},
        key=None,
        headers=None,
        idempotency_key=None,
        delay=None,
        priority=0,
        max_attempts=None,
        content_type=None,
    )
    # `write` is what enqueue and enqueue_async both run once the call is validated.
    with pytest.raises(UnsupportedDatabase, match="not mssql") as refused:
        write(cast(Connection, mssql), prepared)
    assert isinstance(refused.value, outbox.OutboxError)


# --------------------------------------------------------------------------- wake-ups


@pytest.mark.parametrize("url", ["mysql://u@h/db", "mariadb+pymysql://u@h/db"])
def test_a_mysql_relay_polls_and_tries_no_listen(url: str) -> None:
    assert listener_for(url, lambda: None) is None
