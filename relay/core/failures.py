"""Failure classes, named by what the broker may already have received, and their classifier."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from relay.core.outcome import Fate, Outcome


class FailureClass(StrEnum):
    NEVER_SENT = "never_sent"  # the broker saw nothing: no channel, or not handed over
    AMBIGUOUS = "ambiguous"  # sent, no confirm before the channel/connection died: republish
    REJECTED = "rejected"  # basic.nack
    UNROUTABLE = "unroutable"  # basic.return NO_ROUTE (mandatory)
    DESTINATION_MISSING = "destination_missing"  # 404 NOT_FOUND on the exchange
    BACKPRESSURE = "backpressure"  # connection.blocked (resource alarm) or a timeout while blocked
    MALFORMED = "malformed"  # the row cannot be turned into a message


@dataclass(frozen=True, slots=True)
class Classified:
    cls: FailureClass
    detail: str


def classify(outcome: Outcome) -> Classified | None:
    """What kind of failure an outcome is; None when the message was confirmed."""
    fate, detail = outcome.fate, outcome.detail
    if fate is Fate.CONFIRMED:
        return None
    if outcome.malformed:
        return Classified(FailureClass.MALFORMED, detail)
    if outcome.while_blocked and fate in (Fate.UNCONFIRMED, Fate.NOT_SENT):
        return Classified(FailureClass.BACKPRESSURE, detail)
    cls = {
        Fate.NOT_SENT: FailureClass.NEVER_SENT,
        Fate.UNCONFIRMED: FailureClass.AMBIGUOUS,
        Fate.REJECTED: FailureClass.REJECTED,
        Fate.UNROUTABLE: FailureClass.UNROUTABLE,
        Fate.DESTINATION_MISSING: FailureClass.DESTINATION_MISSING,
    }[fate]
    return Classified(cls, detail)


class DbFailure(StrEnum):
    TRANSIENT = "transient"  # retry the statement (connection lost, serialization, deadlock)
    PERMANENT = "permanent"  # retrying cannot help (schema missing, bad data, privileges)


# SQLSTATE classes and codes (PostgreSQL appendix A). Told apart by code, never by message text.
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
