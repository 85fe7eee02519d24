"""What the relay holds: its batches under lease, and the broker's outcomes for them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from opentelemetry.trace import Span

from relay.core.outcome import Outcome
from relay.core.settlement import Settlement
from relay.ports import Claimed


@dataclass(slots=True)
class Lease:
    """One claimed batch: its rows, by seq, until they are settled or released."""

    token: uuid.UUID
    rows: dict[int, Claimed]
    extended_at: float  # clock time of the claim or of the last extension
    spans: dict[int, Span] = field(default_factory=dict)  # send spans, when tracing is on
    sent_at: float | None = None  # clock time it was handed to the publisher (None: not yet)
    suspect: bool = False  # a suspect claimed alone: nothing else may be in flight with it
    overdue: bool = False  # past max_batch_life: settled as unconfirmed without the publisher


class Leases(dict[uuid.UUID, Lease]):
    @property
    def in_flight(self) -> int:
        """Rows held under lease: claimed and not yet settled (a handful of batches, so summing
        is cheaper than keeping a counter in step)."""
        return sum(len(lease.rows) for lease in self.values())


@dataclass(slots=True)
class Finished:
    """The broker's outcomes for a batch, waiting to be written."""

    token: uuid.UUID
    outcomes: list[Outcome]
    # Decided once (the circuits have counted these outcomes), kept if the database fails.
    settlement: Settlement | None = None
    # What the circuits answered so far, per resource part: a part already counted is not
    # counted again when the database fails half way through and the batch is decided again.
    burns: dict[str, list[bool]] = field(default_factory=dict)
    marked: bool = False  # confirmed rows already marked (the failures may still be pending)
