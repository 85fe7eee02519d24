"""Database errors told apart by SQLSTATE, never by message text: pure, no driver imported.

The library's consumer and the relay's store both ask one question of a failed statement: is the
database unavailable for now (retry later), or did this statement fail for good? Both answer it
here, so the two cannot drift apart. The consumer asks one more (`is_conflict`): did the
transaction lose a race with another one? That failure is transient too, but it is caused by the
work being done, so waiting for the database to come back is the wrong cure when it repeats.

MySQL and MariaDB errors carry a number instead of a SQLSTATE: `sqlstate_of` reads any driver's
exception as the SQLSTATE of its condition, so every rule here serves all three databases.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class DbFailure(StrEnum):
    TRANSIENT = "transient"  # retry the statement (connection lost, serialization, deadlock)
    PERMANENT = "permanent"  # retrying cannot help (schema missing, bad data, privileges)


# SQLSTATE classes and codes (PostgreSQL appendix A).
_TRANSIENT_CLASSES = ("08", "53", "57", "58")  # connection, resources, operator, system
_TRANSIENT_CODES = frozenset({"40001", "40P01", "55P03", "25006"})  # serialization, deadlock,
# lock_not_available, read_only_sql_transaction (a failover in progress)
# Two transactions raced and the database failed this one: serialization_failure, deadlock_detected.
CONFLICT_CODES = frozenset({"40001", "40P01"})


def classify_db_error(sqlstate: str | None) -> DbFailure:
    """A database error by its SQLSTATE; no SQLSTATE means the connection itself failed."""
    if sqlstate is None:
        return DbFailure.TRANSIENT
    if sqlstate in _TRANSIENT_CODES or sqlstate[:2] in _TRANSIENT_CLASSES:
        return DbFailure.TRANSIENT
    return DbFailure.PERMANENT


def is_conflict(sqlstate: str | None) -> bool:
    """Whether the transaction lost a race with another one (serialization failure, deadlock).

    Still TRANSIENT for `classify_db_error` (running the transaction again usually succeeds); a
    caller that retries indefinitely while the database is down tells these apart, because the
    same work can lose the same race every time.
    """
    return sqlstate in CONFLICT_CODES


# MySQL and MariaDB number their errors, and their Python drivers (PyMySQL, aiomysql, asyncmy,
# mysqlclient) give no SQLSTATE, only that number, first in the exception's args. Each number the
# project tells apart is written here as the SQLSTATE PostgreSQL gives the same condition, so one
# set of rules (above, and every `sqlstate == ...` test in the project) serves all three
# databases. Any other number is MySQL's own catch-all SQLSTATE, HY000: permanent.
MYSQL_ERRORS: Mapping[int, str] = {
    # Two transactions raced: deadlock, and MariaDB's "record has changed since last read"
    # (innodb_snapshot_isolation), its serialization failure.
    1213: "40P01",
    1020: "40001",
    # A lock not granted in time (innodb_lock_wait_timeout), or at once (NOWAIT).
    1205: "55P03",
    3572: "55P03",
    # The connection: refused, host unknown, gone away, lost mid-query, dropped as idle, cut.
    2002: "08001",
    2003: "08001",
    2005: "08001",
    2006: "08006",
    2013: "08006",
    2055: "08006",
    4031: "08006",
    1152: "08006",
    1158: "08006",
    1159: "08006",
    1160: "08006",
    1161: "08006",
    1184: "08006",
    # The server: shutting down, the connection killed, the statement interrupted or over its
    # time limit (MySQL's max_execution_time, MariaDB's max_statement_time).
    1053: "57P01",
    1927: "57P01",
    1317: "57014",
    3024: "57014",
    1969: "57014",
    # Out of connections, memory, threads or disk.
    1040: "53300",
    1203: "53300",
    1226: "53400",
    1037: "53200",
    1038: "53200",
    1041: "53200",
    1135: "53000",
    1021: "53100",
    # Read-only: a replica, or a primary being failed over.
    1290: "25006",
    1836: "25006",
    1792: "25006",
    # Permanent: privileges, credentials, names, data.
    1044: "42501",
    1142: "42501",
    1143: "42501",
    1227: "42501",
    1370: "42501",
    1045: "28P01",
    1049: "3D000",
    1146: "42P01",
    1054: "42703",
    1064: "42601",
    1062: "23505",
    1586: "23505",
    1048: "23502",
    1451: "23503",
    1452: "23503",
    3819: "23514",
    4025: "23514",
    1406: "22001",
}
MYSQL_OTHER = "HY000"


def mysql_sqlstate(errno: int) -> str | None:
    """The SQLSTATE (PostgreSQL's code) of a MySQL/MariaDB error number; None for 0, which the
    drivers give when the connection itself is gone (PyMySQL's InterfaceError(0, ''))."""
    if errno == 0:
        return None
    return MYSQL_ERRORS.get(errno, MYSQL_OTHER)


def sqlstate_of(orig: object) -> str | None:
    """The SQLSTATE of a driver's exception (SQLAlchemy's `exc.orig`), in PostgreSQL's codes:
    psycopg's and asyncpg's `sqlstate`, psycopg2's `pgcode`, a MySQL driver's error number
    through MYSQL_ERRORS. None
    when it has none: the connection failed before the server said anything (or SQLite, which
    has no SQLSTATE)."""
    args = getattr(orig, "args", ())
    if args and type(args[0]) is int:  # MySQL drivers: (errno, message)
        # Before `sqlstate`: PyMySQL sets one too, MySQL's own, which is not PostgreSQL's
        # (23000 for any integrity error, 40001 for a deadlock).
        return mysql_sqlstate(args[0])
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code if isinstance(code, str) else None
