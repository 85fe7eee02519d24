"""What the relay holds: its claims under lease, the chunks of them the publisher has, and the
broker's outcomes for those chunks.

A row leaves its lease in one of two ways, each in one place: settled (relay/loop/settler.py,
once its chunk's outcomes are written) or released (`Lease.drop`). A chunk is answered once
(`Lease.answer`), by the publisher or by the loop giving up on it.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field

from opentelemetry.trace import Span

from relay.core.outcome import Outcome
from relay.ports import Claimed, Holder


@dataclass(slots=True)
class Chunk:
    """Rows of one lease handed to the publisher together, until the outcomes are written."""

    seqs: list[int]
    sent_at: float  # clock time it was handed over (a chain's chunk: its turn began)
    answered: bool = False  # the publisher answered, or it was given up (Lease.answer)
    chain: str | None = None  # a chunk of this key's chain (relay/loop/chains.py)


@dataclass(slots=True)
class Lease:
    """One claim: its rows, by seq, until they are settled or released. Claimed rows wait in
    `unsent` until the publisher's window has room; the chunks it has are in `chunks`."""

    token: uuid.UUID
    rows: dict[int, Claimed]  # every row not settled yet, sent or not
    extended_at: float  # clock time of the claim or of the last extension
    unsent: deque[Claimed] = field(default_factory=deque)  # in claim order
    chunks: dict[int, Chunk] = field(default_factory=dict)  # sent, not yet written; oldest first
    spans: dict[int, Span] = field(default_factory=dict)  # send spans, when tracing is on
    sent_at: float | None = None  # clock time its first chunk was handed over (None: not yet)
    # Suspects claimed apart (relay/loop/suspects.py): nothing else may be in flight with them.
    # Said by the claim, never changed.
    suspect: bool = False
    # Hot keys' runs (relay/loop/chains.py): the rows of each key's chain not handed over yet
    # (a chain is handed over whole), and rows to release unsent (a chain that broke).
    chains: dict[str, deque[Claimed]] = field(default_factory=dict)
    to_release: list[int] = field(default_factory=list)
    # Chains that may go on (their run came full): key -> the chain's last seq so far.
    tails: dict[str, int] = field(default_factory=dict)
    # Where its rows are settled when not in the outbox table, under a lease of the table's (the
    # relay's store): the log's messages (relay/capture/source.py). Never extended or reclaimed.
    holder: Holder | None = None

    @property
    def sending(self) -> int:
        """Rows handed over and not written yet that could be confirmed and unmarked now: each
        chain counts its oldest chunk only (its others wait for that one to be confirmed)."""
        counted: set[str] = set()
        total = 0
        for chunk in self.chunks.values():
            if chunk.chain is not None:
                if chunk.chain in counted:
                    continue
                counted.add(chunk.chain)
            total += len(chunk.seqs)
        return total

    def answer(self, number: int) -> Chunk | None:
        """The chunk `number`, now answered (its outcomes to be written), or None when it was
        answered already or is gone (given up as overdue, or released): a second answer
        changes nothing."""
        chunk = self.chunks.get(number)
        if chunk is None or chunk.answered:
            return None
        chunk.answered = True
        return chunk

    def drop(self, seqs: list[int]) -> list[Span]:
        """Forget these rows, released: from the rows, the ones waiting to be sent, the chains
        and the give-backs. Returns their send spans, to be ended."""
        gone = set(seqs)
        self.unsent = deque(row for row in self.unsent if row.seq not in gone)
        self.to_release = [seq for seq in self.to_release if seq not in gone]
        for key, rest in list(self.chains.items()):
            rest = self.chains[key] = deque(row for row in rest if row.seq not in gone)
            if not rest:
                del self.chains[key]
        spans = []
        for seq in seqs:
            self.rows.pop(seq, None)
            span = self.spans.pop(seq, None)
            if span is not None:
                spans.append(span)
        return spans

    def unsent_seqs(self) -> list[int]:
        """Every row held and never handed over: side by side, in chains, or to release."""
        chained = [row.seq for rest in self.chains.values() for row in rest]
        return [row.seq for row in self.unsent] + chained + self.to_release


class Leases(dict[uuid.UUID, Lease]):
    """This relay's leases in claim order (a handful at a time, so summing is cheaper than
    keeping counters in step)."""

    @property
    def in_flight(self) -> int:
        """Rows held under lease: claimed and not yet settled."""
        return sum(len(lease.rows) for lease in self.values())

    @property
    def sending(self) -> int:
        """Rows handed to the publisher whose outcomes are not written yet: what a relay killed
        now could leave confirmed, or sent, and unmarked."""
        return sum(lease.sending for lease in self.values())

    @property
    def unsent(self) -> int:
        """Rows claimed to be sent side by side and not yet handed to the publisher (chains go
        at their own pace and do not hold the next claim back)."""
        return sum(len(lease.unsent) for lease in self.values())

    @property
    def waiting(self) -> bool:
        """Whether any row is held and was never handed over (chains and give-backs too)."""
        return any(lease.unsent or lease.chains or lease.to_release for lease in self.values())


@dataclass(frozen=True, slots=True)
class Answer:
    """The broker's outcomes for one chunk of a lease, to be written (how far the writing got
    is the settler's)."""

    token: uuid.UUID
    outcomes: list[Outcome]
    chunk: int = 0
    # Whether writing it may let new rows be claimed: a key's next message (a chunk with a keyed
    # message), not a chunk of a chain that goes on, whose next messages this relay holds.
    frees: bool = True
