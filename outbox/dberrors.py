"""Database errors told apart by SQLSTATE, never by message text: pure, no driver imported.

The library's consumer and the relay's store both ask one question of a failed statement: is the
database unavailable for now (retry later), or did this statement fail for good? Both answer it
here, so the two cannot drift apart.
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


def classify_db_error(sqlstate: str | None) -> DbFailure:
    """A database error by its SQLSTATE; no SQLSTATE means the connection itself failed."""
    if sqlstate is None:
        return DbFailure.TRANSIENT
    if sqlstate in _TRANSIENT_CODES or sqlstate[:2] in _TRANSIENT_CLASSES:
        return DbFailure.TRANSIENT
    return DbFailure.PERMANENT
