"""Database errors told apart by SQLSTATE, never by message text: pure, no driver imported.

The library's consumer and the relay's store both ask one question of a failed statement: is the
database unavailable for now (retry later), or did this statement fail for good? Both answer it
here, so the two cannot drift apart. The consumer asks one more (`is_conflict`): did the
transaction lose a race with another one? That failure is transient too, but it is caused by the
work being done, so waiting for the database to come back is the wrong cure when it repeats.
"""

from __future__ import annotations

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
