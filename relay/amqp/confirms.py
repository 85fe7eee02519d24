"""What the publisher tracks until the broker answers: each chunk's outcomes as they
come, each exchange's confirm channel with its unconfirmed deliveries, and the order of each
chain's chunks (`Chains`: one message at a time, each sent from the confirm of the one before
it; ports.Publisher.publish).

Only the relay's one thread touches these, so nothing here locks.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from relay.core.outcome import HELD_BACK, Fate, Outcome
from relay.ports import Done, Outgoing

# Broken chains remembered (ample: a chain's chunks all arrive within one pass of the relay).
MAX_BROKEN_CHAINS = 4096


@dataclass(slots=True, eq=False)
class Chunk:
    items: Sequence[Outgoing]
    done: Done
    sent_at: float
    outcomes: list[Outcome | None] = field(default_factory=list)
    remaining: int = 0
    chain: Hashable | None = None  # one at a time, each after the one before it is confirmed
    lane: Hashable = None  # whose channels it goes on (Publisher.publish)
    # Message index -> the nacks it got so far: each is resent on a fresh channel while
    # relay/amqp/nacks.py allows (a quorum queue electing a leader), then reported.
    nacks: dict[int, int] = field(default_factory=dict)


Entry = tuple[Chunk, int]


@dataclass(slots=True, eq=False)
class Chan:
    """The confirm channel of one exchange (in one lane), and what is waiting on it."""

    exchange: str
    lane: Hashable = None
    channel: Any = None  # set once confirm mode is on
    next_tag: int = 0
    unconfirmed: dict[int, Entry] = field(default_factory=dict)
    queued: list[Entry] = field(default_factory=list)  # waiting for the channel to open
    # Nacked: nothing more is sent on it (RabbitMQ may go on nacking a channel it nacked once);
    # it is closed once what it has in flight is answered.
    retired: bool = False
    acked: bool = False  # a confirm came on it: a nack after that is the destination's

    @property
    def key(self) -> tuple[Hashable, str]:
        return (self.lane, self.exchange)


def report(chunk: Chunk) -> None:
    """Call the chunk's `done` with its outcomes (every one answered, or held back)."""
    chunk.done([o for o in chunk.outcomes if o is not None])


def hold_back(chunk: Chunk, start: int, why: str) -> None:
    """Answer the chunk's messages from `start` on, unanswered yet, as never sent (held_back)."""
    for j in range(start, len(chunk.items)):
        if chunk.outcomes[j] is None:
            chunk.outcomes[j] = Outcome(chunk.items[j].seq, Fate.NOT_SENT, why, held_back=True)
            chunk.remaining -= 1


class Chains:
    """The chains being sent: each chain's chunks, the one being sent first (the rest wait for
    it to be confirmed), and the chains that broke, most recent last."""

    def __init__(self, send: Callable[[Chunk, int], None]) -> None:
        self._send = send  # sends message i of a chunk: the one before it was confirmed
        self._waiting: dict[Hashable, deque[Chunk]] = {}
        # A chunk of a chain that broke (the relay hands a chain's chunks over together, so
        # only by a race) is held back too.
        self._broken: OrderedDict[Hashable, None] = OrderedDict()

    def held_back(self, chunk: Chunk) -> bool:
        """If the chunk's chain broke already, hold it back whole and answer it: True."""
        if chunk.chain not in self._broken:
            return False
        hold_back(chunk, 0, HELD_BACK)
        report(chunk)
        return True

    def start(self, chunk: Chunk) -> None:
        """Queue a chain's chunk behind the chain's others; send its first message if none is
        being sent."""
        waiting = self._waiting.setdefault(chunk.chain, deque())
        waiting.append(chunk)
        if len(waiting) == 1:  # else it starts when the one before it is all confirmed
            self._send(chunk, 0)

    def answered(self, chunk: Chunk, i: int, outcome: Outcome) -> None:
        """Message `i` of a chain's chunk is answered: send the next (of this chunk, or of the
        chain's next chunk once this one is answered), or, if it was not confirmed, send nothing
        more of the chain: the rest are held back (sending them would put them ahead of it)."""
        confirmed = outcome.fate is Fate.CONFIRMED
        if confirmed and i + 1 < len(chunk.items):
            self._send(chunk, i + 1)
            return
        why = f"{HELD_BACK} ({outcome.fate})"
        if not confirmed:
            hold_back(chunk, i + 1, why)
            self._broken[chunk.chain] = None
            if len(self._broken) > MAX_BROKEN_CHAINS:
                self._broken.popitem(last=False)
        report(chunk)
        waiting = self._waiting.get(chunk.chain)
        if waiting is None or not waiting or waiting[0] is not chunk:
            return
        waiting.popleft()
        while waiting and not confirmed:
            later = waiting.popleft()
            hold_back(later, 0, why)
            report(later)
        if waiting:
            self._send(waiting[0], 0)
        else:
            del self._waiting[chunk.chain]
