"""What became of each message handed to the broker. Pure values; no pika types leak out."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Fate(StrEnum):
    """Named by what the broker may already have received."""

    CONFIRMED = "confirmed"  # basic.ack and no basic.return: the broker has it
    REJECTED = "rejected"  # basic.nack: the broker refused it
    UNROUTABLE = "unroutable"  # basic.return (mandatory): no queue took it
    NOT_SENT = "not_sent"  # never handed to the broker (no channel, or could not be built)
    UNCONFIRMED = "unconfirmed"  # sent, but the channel or connection died before a confirm
    DESTINATION_MISSING = "destination_missing"  # 404 NOT_FOUND: the exchange does not exist


class Outcome(NamedTuple):
    """What became of one message (a NamedTuple: one is made per message, and a frozen
    dataclass's __init__ costs several times as much)."""

    seq: int  # the row's seq: which message this is the outcome of
    fate: Fate
    detail: str = ""
    while_blocked: bool = False  # the connection was blocked by a resource alarm at the time
    malformed: bool = False  # the row could not be turned into a message
    connection_lost: bool = False  # the whole connection failed, not this message's destination
    # Never sent because the message before it in its chain (its key's run) was not confirmed:
    # released unsent, behind that one, rather than settled as a failure of its own.
    held_back: bool = False


HELD_BACK = "held back: an earlier message of its key was not confirmed"
