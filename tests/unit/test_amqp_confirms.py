"""A chain's chunks on the publisher's thread (relay/amqp/confirms.py, Chains), without a
broker: one message at a time, each sent once the one before it is confirmed; after the first
that is not, nothing more of the chain is sent, in this chunk or a later one."""

from __future__ import annotations

import time

from relay.amqp.confirms import Chains, Chunk
from relay.core.outcome import Fate, Outcome
from relay.ports import Outgoing


def item(ref: int) -> Outgoing:
    return Outgoing(ref, str(ref), "ex", "rk", b"{}", b"", b"")


class Wire:
    """What Chains sends, and the answers each chunk got."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.answers: list[list[Outcome]] = []
        self.chains = Chains(self.send)

    def send(self, chunk: Chunk, i: int) -> None:
        self.sent.append(chunk.items[i].seq)

    def chunk(self, *refs: int) -> Chunk:
        n = len(refs)
        chunk = Chunk([item(r) for r in refs], self.answers.append, time.monotonic(), chain="k")
        chunk.outcomes, chunk.remaining = [None] * n, n
        return chunk

    def answer(self, chunk: Chunk, i: int, fate: Fate) -> None:
        """As the publisher's _answer does for a chain's message."""
        outcome = chunk.outcomes[i] = Outcome(chunk.items[i].seq, fate)
        chunk.remaining -= 1
        self.chains.answered(chunk, i, outcome)


def test_each_message_goes_once_the_one_before_it_is_confirmed() -> None:
    wire = Wire()
    first, second = wire.chunk(1, 2), wire.chunk(3)
    wire.chains.start(first)
    wire.chains.start(second)  # waits for the first
    assert wire.sent == [1]
    wire.answer(first, 0, Fate.CONFIRMED)
    assert wire.sent == [1, 2]
    wire.answer(first, 1, Fate.CONFIRMED)
    assert wire.sent == [1, 2, 3]
    assert [[o.seq for o in a] for a in wire.answers] == [[1, 2]]
    wire.answer(second, 0, Fate.CONFIRMED)
    assert [[o.fate for o in a] for a in wire.answers] == [[Fate.CONFIRMED] * 2, [Fate.CONFIRMED]]


def test_after_a_failure_the_rest_of_the_chain_is_held_back_unsent() -> None:
    wire = Wire()
    first, second = wire.chunk(1, 2, 3), wire.chunk(4)
    wire.chains.start(first)
    wire.chains.start(second)
    wire.answer(first, 0, Fate.CONFIRMED)
    wire.answer(first, 1, Fate.REJECTED)
    assert wire.sent == [1, 2]
    answered = [(o.seq, o.fate, o.held_back) for a in wire.answers for o in a]
    assert answered == [
        (1, Fate.CONFIRMED, False),
        (2, Fate.REJECTED, False),
        (3, Fate.NOT_SENT, True),
        (4, Fate.NOT_SENT, True),
    ]
    late = wire.chunk(5)  # handed over after the break: held back whole, never sent
    assert wire.chains.held_back(late)
    assert wire.sent == [1, 2]
    assert [(o.seq, o.held_back) for o in wire.answers[-1]] == [(5, True)]


def test_a_chain_that_did_not_break_holds_nothing_back() -> None:
    wire = Wire()
    assert not wire.chains.held_back(wire.chunk(1))
    assert wire.answers == []
