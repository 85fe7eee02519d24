"""Chains: the runs of hot keys a claim brings (relay/store/postgres.py, "Runs"), published one
message at a time.

A claim returns, beside its heads, up to RUN messages of each keyed head's key. They are held
apart from the other rows as that key's chain, in key order, and handed to the publisher in
pieces, all at once, as one chain: each message is sent once the one before it is confirmed,
straight from the confirm's callback, and each piece is answered (and marked) as soon as its
last message is confirmed. So a hot key drains at the broker's confirm pace, not at one
claim-publish-mark cycle per message, and its order holds: after the first message that is not
confirmed, the publisher sends nothing more of the chain, and the rest is given back unsent,
behind it.

A chain whose run came full goes on: before it ends, the key's next run is claimed under the
chain's own lease (Store.claim_run) and handed over as more pieces of the same chain, so the
publisher sends its first message from the confirm of the chain's last. What the publisher holds
back after a failure includes them.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence

from relay.loop.leases import Chunk, Finished, Lease
from relay.ports import Claimed

# Messages of one key a claim takes at most behind its head: with it, two pieces. A relay killed
# mid-run leaves the run's unsent messages as suspects, each then published on its own
# (common.GROUPED), so not much longer.
RUN = 127
# Messages of a chain answered together: a piece's confirmed messages are marked once its last
# one is confirmed, so this is also what a relay killed mid-chain leaves confirmed and unmarked
# (and what a chain takes of the publisher's window, whatever its length: the window, not the
# piece, bounds what a crash leaves). Larger pieces mean fewer marks beside the chain, so a hot
# key drains faster than with smaller ones (the `hot-key` benchmark drains one).
PIECE = 64
# A chain whose run came full (its key has more) goes on: once this many of its messages are left
# to be confirmed, the key's next NEXT_RUN messages are claimed under the chain's own lease
# (Store.claim_run) and handed over behind it, so the key's next message follows the chain's last
# one at once instead of after its mark and a claim. Starting the claim a whole piece before the
# end leaves it the time of PIECE confirms, which is normally longer than a claim takes.
EXTEND_AT = PIECE
NEXT_RUN = RUN + 1


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


def pieces(chain: Iterable[Claimed], size: int = PIECE) -> list[list[Claimed]]:
    """A chain cut into the pieces it is handed over in (all at once: the publisher sends the
    next piece as soon as the one before it is confirmed)."""
    rows = list(chain)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def answered(lease: Lease, chunk: Chunk, finished: Finished, now: float) -> None:
    """A piece of a chain came back. If a message of it was not confirmed, the chain ended
    there: its held-back messages (of this piece, and of the pieces after it, which come back
    held back whole) leave `finished`, as they were never sent and there is nothing to settle,
    and wait in `give_back` to be released unsent, behind the one that failed."""
    key = chunk.chain
    if key is None:
        return
    after = next((c for c in lease.chunks.values() if c.chain == key and not c.answered), None)
    if after is not None:  # the chain goes on: nothing new to claim for it yet
        finished.frees = False
        after.sent_at = now  # its messages go out from now on (overdue() counts from here)
    held = [o.ref for o in finished.outcomes if o.held_back]
    if held:
        lease.tails.pop(key, None)  # the chain broke: what follows waits for the one that failed
        finished.outcomes = [o for o in finished.outcomes if not o.held_back]
        lease.give_back.extend(held)


def left(lease: Lease, key: str) -> int:
    """Messages of the key's chain held and not answered yet (handed over or not)."""
    sent = sum(len(c.seqs) for c in lease.chunks.values() if c.chain == key and not c.answered)
    return sent + len(lease.chains.get(key, ()))


def tails(runs: dict[str, deque[Claimed]]) -> dict[str, int]:
    """The keys whose run a claim took full (they may have more), and the last seq of each."""
    return {key: rest[-1].seq for key, rest in runs.items() if len(rest) > RUN}


def overdue(chunk: Chunk, now: float, life: float) -> bool:
    """Whether the publisher has held `chunk` too long. A piece of a chain is sent one message
    per confirm from the moment the piece before it was answered: its first message gets the
    whole `life`, each further one a third of it (what the default life gives one confirm)."""
    if chunk.chain is not None:
        life += (len(chunk.seqs) - 1) * life / 3
    return now - chunk.sent_at > life
