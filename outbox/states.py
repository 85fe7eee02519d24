"""Message states and suspects, shared by the library, the relay and the operator commands."""

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


class Suspect(StrEnum):
    """How a message whose relay died while it was in flight is claimed, as stored in its row's
    `suspect` column (NULL for every other message). The relay claims a suspect apart from
    every other message, and publishes it with nothing else in flight, so that a message that
    kills its relay takes only itself down (relay/core/suspects.py holds the rules).

    - `group`: claimed with other suspects only;
    - `alone`: claimed by itself.

    A claim leaves the column as it is: while in flight it says how the row was claimed.
    """

    GROUP = "group"
    ALONE = "alone"


# Relays of release 0.2.0 (schema 6) know a suspect by a pending row's lease_expires_at and its
# isolation by these texts in last_error. Relays write both beside the suspect column, so that
# such relays running beside them isolate crashes as before (docs/operations/upgrading.md), and
# migrate reads them once, when it adds the column.
STAMP_GROUPED = "claimed with other suspects only: the last lease on it ended before it settled"
STAMP_SOLITARY = "to be claimed alone: its relay died while it was in flight with other suspects"
STAMP_ALONE = "claimed alone: the last lease on it ended before it settled (its relay died)"
