"""Chains: the runs of hot keys a claim brings (relay/store/postgres.py, "Runs"), published one
message at a time.

A claim returns, beside its heads, up to RUN messages of each keyed head's key. They are held
apart from the other rows as that key's chain, in key order, and handed to the publisher a piece
at a time (`chained`: each message sent once the one before it is confirmed, straight from the
confirm's callback). So a hot key drains at the broker's confirm pace, not at one
claim-publish-mark cycle per message, and its order holds: after the first message that is not
confirmed, the rest of the chain (the piece's held-back messages and the pieces not handed over)
is given back unsent, behind it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from relay.core.outcome import Fate
from relay.loop.leases import Chunk, Finished, Lease
from relay.ports import Claimed

# Messages of one key a claim takes at most behind its head. Longer runs spend less of the key's
# time between runs (a mark and a claim); a relay killed mid-run leaves the run's unsent messages
# as suspects, each then published on its own (common.GROUPED), so not much longer.
RUN = 128
# Messages of a chain handed over together: its confirmed messages are marked when the piece is
# answered, so this is also what a relay killed mid-chain leaves confirmed and unmarked.
PIECE = 32
HELD_BACK = "held back: an earlier message of its key was not confirmed"


def split(rows: Sequence[Claimed]) -> tuple[list[Claimed], dict[str, deque[Claimed]]]:
    """A claim's rows as the ones sent side by side (in claim order) and the chains: every key
    with more than one row, in key order (seq), whatever the claim order said."""
    per_key = Counter(row.key for row in rows if row.key is not None)
    singles = [row for row in rows if row.key is None or per_key[row.key] == 1]
    chains: dict[str, deque[Claimed]] = {}
    for row in sorted((r for r in rows if r.key is not None and per_key[r.key] > 1),
                      key=lambda r: r.seq):  # fmt: skip
        assert row.key is not None
        chains.setdefault(row.key, deque()).append(row)
    return singles, chains


def next_piece(lease: Lease, key: str, room: int) -> list[Claimed]:
    """The next rows of `key`'s chain to hand over (none while a piece of it is out)."""
    rest = lease.chains.get(key)
    if key in lease.busy or not rest or room <= 0:
        return []
    lease.busy.add(key)
    return [rest.popleft() for _ in range(min(PIECE, room, len(rest)))]


def answered(lease: Lease, chunk: Chunk, finished: Finished) -> None:
    """A piece of a chain came back. All confirmed: the chain goes on (the next pump hands the
    next piece). Else the chain ends here: its held-back messages leave `finished` (they were
    never sent, there is nothing to settle) and, with the pieces not handed over, wait in
    `give_back` to be released unsent, behind the one that failed."""
    key = chunk.chain
    if key is None:
        return
    lease.busy.discard(key)
    broken = any(o.fate is not Fate.CONFIRMED for o in finished.outcomes)
    if not broken:
        if lease.chains.get(key):
            finished.frees = False  # the chain goes on: nothing new to claim for it
        else:
            lease.chains.pop(key, None)
        return
    held = [o.ref for o in finished.outcomes if o.held_back]
    finished.outcomes = [o for o in finished.outcomes if not o.held_back]
    rest = lease.chains.pop(key, deque())
    lease.give_back.extend(held + [row.seq for row in rest])
