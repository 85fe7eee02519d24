"""Suspects in the loop: rows whose relay died holding them, published apart so that a row that
kills relays kills only itself (docs/concepts/crash-isolation.md).

The store decides who is a suspect and claims them apart from every other row, at most
SUSPECT_GROUP together or one alone (relay/core/suspects.py). The loop's part is here:

- a claim of suspects is a suspect lease (`claimed_apart`), marked so when it is made;
- while one is held, nothing else is claimed, extended or probed (`quarantined`);
- its rows are handed to the publisher only once nothing else is in flight (`may_send`);
- a relay that crashes gives up the leases it had sent as their running out would (`abandon`),
  which makes their rows suspects for the next relay.

A suspect lease is only ever alone among the leases it could wait behind, so whether claiming is
quarantined is read from the leases themselves: it ends when the lease is settled or released,
with no flag of the claimer's to clear.
"""

from __future__ import annotations

from collections.abc import Sequence

from relay.loop.leases import Lease, Leases
from relay.ports import Claimed

# Suspects claimed together at most: if they kill this relay too, each of them is then
# published alone (relay/core/suspects.py), at a few milliseconds apiece.
SUSPECT_GROUP = 100


def claimed_apart(rows: Sequence[Claimed]) -> bool:
    """Whether a claim's rows are suspects (the store claims them apart from every other row,
    so the first says it for all)."""
    return rows[0].suspect


def quarantined(leases: Leases) -> bool:
    """Whether suspects hold claiming: they wait for the rest to settle, then go alone, and
    nothing else is claimed until they settle."""
    return any(lease.suspect for lease in leases.values())


def may_send(lease: Lease, leases: Leases) -> bool:
    """Whether `lease`'s rows may be handed over now: a suspect lease's only once every row in
    flight is its own."""
    return not lease.suspect or leases.in_flight == len(lease.rows)


def abandon(lease: Lease, *, crashed: bool) -> bool:
    """Whether a relay stopping gives `lease` up as its running out would (Store.abandon) rather
    than release it: after a crash, if any of its rows was sent, one of them may be why. They
    come back as suspects, the one claimed alone charged for it, so a row that crashes the relay
    every time ends dead, and alone."""
    return crashed and lease.sent_at is not None
