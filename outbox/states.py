"""Message states, shared by the library, the relay and the operator commands."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "pending"  # waiting to be claimed (ready, or delayed until available_at)
    IN_FLIGHT = "in_flight"  # claimed by a relay under a lease
    PUBLISHED = "published"  # confirmed by the broker
    DEAD = "dead"  # gave up; kept with its reason for an operator
    CANCELLED = "cancelled"  # an operator stopped it before it was sent
    DISCARDED = "discarded"  # an operator dropped a dead message; kept for audit


ALL_STATES: tuple[str, ...] = tuple(s.value for s in State)
