"""Chains: the runs of hot keys a claim brings (relay/store/postgres.py, "Runs"), published one
message at a time.

A claim returns, beside its heads, up to RUN messages of each keyed head's key. They are held
apart from the other rows as that key's chain, in key order, and handed to the publisher in
chunks, all at once, as one chain: each message is sent once the one before it is confirmed,
straight from the confirm's callback, and each chunk is answered (and marked) as soon as its
last message is confirmed. So a hot key drains at the broker's confirm pace, not at one
claim-publish-mark cycle per message, and its order holds: after the first message that is not
confirmed, the publisher sends nothing more of the chain, and the rest is released unsent,
behind it.

A chain whose run came full goes on: before it ends, the key's next run is claimed under the
chain's own lease (Store.claim_run) and handed over as more chunks of the same chain, so the
publisher sends its first message from the confirm of the chain's last. What the publisher holds
back after a failure includes them.

The loop's side of chains is here, each step a function of the lease it changes: a claim's rows
are `split` into the rows sent side by side and the chains (with their `tails`, the chains that
may go on); `hand_over` gives the publisher each chain whole when its first chunk fits in the
window, and `cut` ends one at a row that cannot be built; `answered` takes a chunk's answer
(the chain goes on, or broke); `extend` claims the next runs; `overdue_chunks` says which chunks
the publisher has held too long. A lease's chain state (`Lease.chains`, `to_release`, `tails`) is
changed only here, and by `Lease.drop` when rows are released. The publisher's side, sending
one message per confirm, is relay/amqp/confirms.py (Chains).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence

from relay.core.outcome import HELD_BACK, Fate, Outcome
from relay.loop.leases import Answer, Chunk, Lease, Leases
from relay.ports import Claimed, Outgoing

# Messages of one key a claim takes at most behind its head: with it, two chunks. A relay killed
# mid-run leaves the run's unsent messages as suspects, each then published on its own
# (relay/core/suspects.py), so not much longer.
RUN = 127
# Messages of a chain answered together: a chunk's confirmed messages are marked once its last
# one is confirmed, so this is also what a relay killed mid-chain leaves confirmed and unmarked
# (and what a chain takes of the publisher's window, whatever its length: the window, not the
# chunk, bounds what a crash leaves). Larger chunks mean fewer marks beside the chain, so a hot
# key drains faster than with smaller ones (the `hot-key` benchmark drains one).
CHUNK = 64
# A chain whose run came full (its key has more) goes on: once this many of its messages are left
# to be confirmed, the key's next NEXT_RUN messages are claimed under the chain's own lease
# (Store.claim_run) and handed over behind it, so the key's next message follows the chain's last
# one at once instead of after its mark and a claim. Starting the claim a whole chunk before the
# end leaves it the time of CHUNK confirms, which is normally longer than a claim takes.
EXTEND_AT = CHUNK
NEXT_RUN = RUN + 1

# Hands one chunk of a chain (of the lease, with the chain's key) to the publisher; False when a
# row of it cannot be built (`cut`).
Send = Callable[[Lease, list[Claimed], str], bool]


# ----------------------------------------------------------------------- claimed


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


def tails(runs: dict[str, deque[Claimed]]) -> dict[str, int]:
    """The keys whose run a claim took full (they may have more), and the last seq of each."""
    return {key: rest[-1].seq for key, rest in runs.items() if len(rest) > RUN}


# ----------------------------------------------------------------------- handed over


def chunked(chain: Iterable[Claimed], size: int = CHUNK) -> list[list[Claimed]]:
    """A chain cut into the chunks it is handed over in (all at once: the publisher sends the
    next chunk as soon as the one before it is confirmed)."""
    rows = list(chain)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def hand_over(leases: Iterable[Lease], room: int, size: int, send: Send) -> int:
    """Hand over, whole, every chain whose first chunk fits in `room`; return the room left.
    Each chain takes one chunk of the window, however long (only its oldest chunk can be
    confirmed and unmarked at once), and a chain kept waiting holds its key back."""
    for lease in list(leases):
        for key, rest in list(lease.chains.items()):
            cut_up = chunked(rest, size)
            if len(cut_up[0]) > room:
                continue
            del lease.chains[key]
            room -= len(cut_up[0])
            for n, chunk in enumerate(cut_up):
                if not send(lease, chunk, key):
                    # A row that cannot be built cut the chain: what follows it waits.
                    lease.to_release.extend(row.seq for p in cut_up[n + 1 :] for row in p)
                    lease.tails.pop(key, None)
                    break
    return room


def cut(
    rows: list[Claimed], items: list[Outgoing], broken: list[Outcome]
) -> tuple[list[Outcome], list[Outgoing]]:
    """A chunk of a chain some of whose rows cannot be built (`broken`, dead-lettered as
    malformed): nothing after the first of them may go before it is dealt with, so every row
    after it is held back, built or not (a later malformed one is dealt with once it is the
    key's head). Returns the outcomes to answer at once and the items still to send."""
    first = min(o.seq for o in broken)
    kept = [item for item in items if item.seq < first]
    held = [Outcome(row.seq, Fate.NOT_SENT, HELD_BACK, held_back=True)
            for row in rows if row.seq > first]  # fmt: skip
    return [o for o in broken if o.seq == first] + held, kept


# ----------------------------------------------------------------------- answered


def answered(lease: Lease, chunk: Chunk, answer: Answer, now: float) -> Answer:
    """What is to be written of a chunk that came back (`chunk` is answered already). A chunk of
    a chain that goes on frees nothing to claim, and the next chunk's messages go out from now
    on (overdue() counts from here). If a message of it was not confirmed, the chain ended
    there: its held-back messages (of this chunk, and of the chunks after it, which come back
    held back whole) are left out, as they were never sent and there is nothing to settle, and
    wait in `to_release` to be released unsent, behind the one that failed."""
    key = chunk.chain
    if key is None:
        return answer
    frees = answer.frees
    after = next((c for c in lease.chunks.values() if c.chain == key and not c.answered), None)
    if after is not None:  # the chain goes on: nothing new to claim for it yet
        frees = False
        after.sent_at = now
    outcomes = answer.outcomes
    held = [o.seq for o in outcomes if o.held_back]
    if held:
        lease.tails.pop(key, None)  # the chain broke: what follows waits for the one that failed
        outcomes = [o for o in outcomes if not o.held_back]
        lease.to_release.extend(held)
    if frees is answer.frees and outcomes is answer.outcomes:
        return answer
    return dataclasses.replace(answer, outcomes=outcomes, frees=frees)


def left(lease: Lease, key: str) -> int:
    """Messages of the key's chain held and not answered yet (handed over or not)."""
    sent = sum(len(c.seqs) for c in lease.chunks.values() if c.chain == key and not c.answered)
    return sent + len(lease.chains.get(key, ()))


# ----------------------------------------------------------------------- going on


def extend(
    leases: Leases,
    *,
    room: Callable[[], int],
    claim_run: Callable[[Lease, int, int], list[Claimed]],
) -> None:
    """Claim the next run of every chain that came full and is about to run out (EXTEND_AT),
    under the chain's own lease: `claim_run(lease, tail, limit)` claims up to `limit` of the
    key's messages after its last one, NEXT_RUN at most and no more than the relay may still
    hold (`room`). May raise DatabaseUnavailable."""
    for lease in list(leases.values()):
        for key, tail in list(lease.tails.items()):
            remaining = left(lease, key)
            if remaining > EXTEND_AT:
                continue
            limit = min(NEXT_RUN, room())
            if limit <= 0:
                return
            # Once per tail: a chain that ended (nothing left) goes the usual way, its mark
            # unparking the key's next message for a claim.
            del lease.tails[key]
            if remaining == 0:
                continue
            rows = claim_run(lease, tail, limit)
            if not rows:
                continue
            lease.rows.update((row.seq, row) for row in rows)
            lease.chains.setdefault(key, deque()).extend(rows)
            if len(rows) == limit:
                lease.tails[key] = rows[-1].seq


# ----------------------------------------------------------------------- overdue


def overdue_chunks(lease: Lease, now: float, life: float) -> list[tuple[int, Chunk]]:
    """The chunks of `lease` the publisher has held too long, by number: of each chain only the
    chunk being sent is looked at (the ones after it wait for it)."""
    fronts: set[str] = set()  # chains whose chunk being sent was looked at
    due = []
    for number, chunk in lease.chunks.items():
        if chunk.answered:
            continue  # being written
        if chunk.chain is not None:
            if chunk.chain in fronts:
                continue
            fronts.add(chunk.chain)
        if overdue(chunk, now, life):
            due.append((number, chunk))
    return due


def overdue(chunk: Chunk, now: float, life: float) -> bool:
    """Whether the publisher has held `chunk` too long. A chunk of a chain is sent one message
    per confirm from the moment the chunk before it was answered: its first message gets the
    whole `life`, each further one a third of it (what the default life gives one confirm)."""
    if chunk.chain is not None:
        life += (len(chunk.seqs) - 1) * life / 3
    return now - chunk.sent_at > life
