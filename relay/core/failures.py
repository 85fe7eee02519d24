"""Failure classes, named by what the broker may already have received, and their classifier."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from outbox.dberrors import DbFailure, classify_db_error
from relay.core.outcome import Fate, Outcome

# Database failures are classified by the library, which owns the rule (its consumer needs it
# and must not import the relay); re-exported for the relay's code that names them here.
__all__ = ["Classified", "DbFailure", "FailureClass", "classify", "classify_db_error"]


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
