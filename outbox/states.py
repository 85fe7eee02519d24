"""Message states, shared by the library, the relay and the operator commands."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """The state of an outbox message, as stored in its row and shown by `outbox-relay status`.

    - `pending`: waiting to be claimed (ready, or delayed until its time);
    - `in_flight`: claimed by a relay under a lease, being published;
    - `published`: confirmed by the broker;
    - `dead`: the relay gave up; kept with its reason for an operator (replay or discard);
    - `cancelled`: an operator stopped it before it was sent;
    - `discarded`: an operator dropped a dead message; kept for audit.

    A `State` is a `str`, so it compares equal to the text stored in the row.
    """

    PENDING = "pending"  # waiting to be claimed (ready, or delayed until available_at)
    IN_FLIGHT = "in_flight"  # claimed by a relay under a lease
    PUBLISHED = "published"  # confirmed by the broker
    DEAD = "dead"  # gave up; kept with its reason for an operator
    CANCELLED = "cancelled"  # an operator stopped it before it was sent
    DISCARDED = "discarded"  # an operator dropped a dead message; kept for audit


ALL_STATES: tuple[str, ...] = tuple(s.value for s in State)
