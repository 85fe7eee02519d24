"""Chains, against fakes: the run of a hot key a claim brings is published one message at a
time in key order, a chunk at a time; after a message that is not confirmed, the rest of the
chain is given back unsent (no attempt charged) while the rows beside it go on."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from relay.core.outcome import HELD_BACK, Fate, Outcome
from relay.loop import chains
from relay.loop.relay import Relay
from relay.ports import Outgoing
from tests.unit.fakes import FakePublisher, FakeStore, make_claimed
from tests.unit.test_relay_loop import make_relay


class ReleasingStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.releases: list[tuple[list[int], str]] = []

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int:
        released = super().release(token, seqs, delay_seconds=delay_seconds, error=error)
        self.releases.append((list(seqs), error))
        return released


def test_split_keeps_claim_order_for_singles_and_key_order_for_chains() -> None:
    rows = [
        make_claimed(5, key="hot", priority=9),  # claimed first (priority), yet after 3 in key
        make_claimed(1),
        make_claimed(3, key="hot"),
        make_claimed(2, key="cold"),
        make_claimed(4, key="hot"),
    ]
    singles, runs = chains.split(rows)
    assert [r.seq for r in singles] == [1, 2]
    assert {k: [r.seq for r in rest] for k, rest in runs.items()} == {"hot": [3, 4, 5]}


def test_a_hot_keys_run_goes_out_chained_in_key_order_beside_the_rest() -> None:
    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2, key="k"), make_claimed(3))
    store.add(*(make_claimed(seq, key="k", priority=1 if seq == 6 else 0) for seq in (4, 5, 6)))
    publisher = FakePublisher()
    relay, _ = make_relay(store, publisher)
    relay.run_once()
    relay.run_once()
    assert store.runs_asked[0] == chains.RUN
    assert publisher.chained == [[2, 4, 5, 6]]
    assert store.states() == dict.fromkeys(range(1, 7), "published")
    assert relay.in_flight == 0


def test_a_chain_is_handed_over_whole_and_takes_one_piece_of_the_window() -> None:
    store = FakeStore()
    count = chains.RUN + 1  # a run and its head: the claim takes them all
    assert count > chains.CHUNK
    store.add(*(make_claimed(seq, key="k") for seq in range(1, count + 1)))
    store.add(*(make_claimed(seq) for seq in range(1000, 1100)))
    publisher = FakePublisher(hold=True)
    window = chains.CHUNK * 2 + 8
    relay, _ = make_relay(store, publisher, claim_max=500, window=window)
    relay.run_once()
    assert publisher.chained == seq_pieces(1, count)
    # Only the chain's first chunk can be confirmed and unmarked at once: the rest of the
    # window goes to the rows beside it.
    beside = [i.seq for i in publisher.published if i.seq >= 1000]
    assert len(beside) == window - chains.CHUNK
    publisher.confirm_held()
    relay.run_once()
    relay.run_once()
    publisher.confirm_held()
    relay.run_once()
    assert set(store.states().values()) == {"published"}


def test_after_a_failure_the_rest_of_the_chain_is_given_back_unsent() -> None:
    store = ReleasingStore()
    count = chains.CHUNK + 5
    store.add(*(make_claimed(seq, key="k") for seq in range(1, count + 1)))
    store.add(make_claimed(100))

    def decide(item: Outgoing) -> Outcome:
        if item.seq == 3:
            return Outcome(item.seq, Fate.REJECTED, "basic.nack from broker")
        return Outcome(item.seq, Fate.CONFIRMED)

    publisher = FakePublisher(decide=decide)
    relay, _ = make_relay(store, publisher)
    released = relay.run_once().released + relay.run_once().released
    states = store.states()
    assert [states[s] for s in (1, 2)] == ["published", "published"]
    assert states[3] == "pending"  # retried later, its own failure recorded
    assert store.rows[3].error == "basic.nack from broker"
    # The rest never went out: given back as they were, with no attempt charged.
    assert [s for (s, *_) in store.history if s > 3] == []
    assert [s for s in range(4, count + 1) if states[s] != "pending"] == []
    assert [s for s in range(4, count + 1) if store.rows[s].released != 1] == []
    assert store.releases == [(list(range(4, count + 1)), HELD_BACK)]
    # The second chunk was handed over with the first, and held back whole.
    assert publisher.chained == [
        list(range(1, chains.CHUNK + 1)),
        list(range(chains.CHUNK + 1, count + 1)),
    ]
    assert states[100] == "published"  # beside the chain, nothing changes
    assert released == count - 3
    assert relay.in_flight == 0


def test_a_chain_given_back_while_the_database_is_down_is_given_back_later() -> None:
    store = ReleasingStore()
    store.add(*(make_claimed(seq, key="k") for seq in range(1, 6)))

    def decide(item: Outgoing) -> Outcome:
        fate = Fate.UNROUTABLE if item.seq == 2 else Fate.CONFIRMED
        return Outcome(item.seq, fate, "312 NO_ROUTE")

    publisher = FakePublisher(decide=decide, hold=True)
    relay, _ = make_relay(store, publisher)
    relay.run_once()
    publisher.confirm_held()
    store.fail_next.append("release")
    relay.run_once()
    assert store.releases == []  # the database failed: the rows stay held, under lease
    assert relay.in_flight == 3
    relay.run_once()
    assert store.releases == [([3, 4, 5], HELD_BACK)]
    assert relay.in_flight == 0


def _chain_of_three(*malformed: int) -> tuple[ReleasingStore, FakePublisher, Relay]:
    """Rows 1-3 of one key (those in `malformed` cannot be built), after two passes."""
    store = ReleasingStore()
    store.add(*(make_claimed(seq, key="k", payload=object()) for seq in malformed))
    store.add(*(make_claimed(seq, key="k") for seq in (1, 2, 3) if seq not in malformed))
    publisher = FakePublisher()
    relay, _ = make_relay(store, publisher)
    relay.run_once()
    relay.run_once()
    return store, publisher, relay


def test_a_malformed_row_holds_back_the_rest_of_its_chain() -> None:
    store, publisher, _ = _chain_of_three(2)
    states = store.states()
    assert states[1] == "published"
    assert states[2] == "dead"  # malformed: dead-lettered with its reason
    assert states[3] == "pending"  # never sent before the row ahead of it was dealt with
    assert [i.seq for i in publisher.published] == [1]
    assert store.releases == [([3], HELD_BACK)]


def test_a_second_malformed_row_behind_the_first_is_held_back_not_lost() -> None:
    # Both rows of the chunk fail to build: the first is dead-lettered, and the second, like any
    # row behind it, is given back unsent (dropped from the answer, it would never be settled:
    # its lease extended for ever, its key stuck behind it).
    store, publisher, relay = _chain_of_three(1, 2)
    states = store.states()
    assert states[1] == "dead"
    assert (states[2], states[3]) == ("pending", "pending")
    assert store.releases == [([2, 3], HELD_BACK)]
    assert publisher.published == []
    assert relay.in_flight == 0


def test_stopping_gives_back_the_chains_not_handed_over() -> None:
    store = ReleasingStore()
    store.add(*(make_claimed(seq, key="a") for seq in range(1, 41)))
    store.add(*(make_claimed(seq, key="b") for seq in range(41, 81)))
    publisher = FakePublisher(hold=True)
    # Room for one chain's chunk: the second chain waits for the first one's.
    relay, _ = make_relay(store, publisher, window=chains.CHUNK + 8)
    relay.run_once()
    assert {ref for refs in publisher.chained for ref in refs} == set(range(1, 41))
    relay.request_stop()
    publisher.confirm_held()
    relay.run()
    states = store.states()
    assert [s for s in range(1, 41) if states[s] != "published"] == []
    assert [s for s in range(41, 81) if states[s] != "pending"] == []
    assert relay.in_flight == 0


def test_a_chain_piece_is_overdue_only_for_its_own_messages_from_its_turn() -> None:
    """A chunk's messages go one per confirm, and only once the chunk before it is answered:
    a slow but live chain is not given up, and its second chunk's time starts at its turn."""
    store = FakeStore()
    count = chains.CHUNK * 2
    store.add(*(make_claimed(seq, key="k") for seq in range(1, count + 1)))
    publisher = FakePublisher(hold=True)
    relay, clock = make_relay(store, publisher, confirm_timeout=1.0, batch_life=3.0)
    relay.run_once()
    assert len(publisher.held) == 2
    # Past the life of a batch, well within what 32 confirms one after another may take.
    clock.now += 3.0 * 2
    relay.run_once()
    held = publisher.held
    first, second = held
    publisher.held = [second]
    first[1]([publisher.decide(i) for i in first[0]])
    clock.now += 3.0 * 2  # the second chunk's turn began just now
    relay.run_once()
    assert [store.rows[s].state for s in (1, count)] == ["published", "in_flight"]
    assert store.history == []
    clock.now += 3.0 * (1 + (chains.CHUNK - 1) / 3) + 1  # now past its whole allowance
    relay.run_once()
    relay.run_once()
    assert (count, "test", "Retry") in store.history  # given up as unconfirmed: sent again


def seq_pieces(first: int, count: int) -> list[list[int]]:
    """The chunks `count` messages from seq `first` on are handed over in."""
    seqs = list(range(first, first + count))
    return [seqs[i : i + chains.CHUNK] for i in range(0, count, chains.CHUNK)]


def hot_key(store: FakeStore, count: int) -> None:
    store.add(*(make_claimed(seq, key="k") for seq in range(1, count + 1)))


def drain_piece_by_piece(relay: Relay, publisher: FakePublisher) -> None:
    for _ in range(100):
        relay.run_once()
        if not publisher.held:
            return
        publisher.answer_first()
    raise AssertionError("the chain never ended")


def test_a_chain_that_came_full_goes_on_under_its_lease_before_it_ends() -> None:
    store = FakeStore()
    count = chains.RUN + 1 + chains.NEXT_RUN + 10
    hot_key(store, count)
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=500)
    relay.run_once()
    first = seq_pieces(1, chains.RUN + 1)
    assert publisher.chained == first  # the run and its head: what the claim took
    assert store.runs_extended == []  # more than EXTEND_AT left to confirm
    answered = 0
    while not store.runs_extended:
        publisher.answer_first()
        answered += chains.CHUNK
        relay.run_once()  # once EXTEND_AT are left: the next run, handed over behind the chain
    assert chains.RUN + 1 - answered == chains.EXTEND_AT
    assert store.runs_extended == [chains.RUN + 1]
    after = seq_pieces(chains.RUN + 2, chains.NEXT_RUN)
    assert publisher.chained == first + after
    drain_piece_by_piece(relay, publisher)
    assert store.runs_extended == [chains.RUN + 1, chains.RUN + 1 + chains.NEXT_RUN]
    assert set(store.states().values()) == {"published"}
    assert [item.seq for item in publisher.published] == list(range(1, count + 1))
    assert len(set(publisher.chain_ids)) == 1  # one chain: each chunk after the one before
    assert relay.in_flight == 0


def test_a_run_that_did_not_come_full_is_not_extended() -> None:
    store = FakeStore()
    hot_key(store, chains.RUN)  # the key's whole line, a message short of a full run
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=500)
    drain_piece_by_piece(relay, publisher)
    assert store.runs_extended == []
    assert set(store.states().values()) == {"published"}


def test_a_chain_that_broke_is_not_extended() -> None:
    store = ReleasingStore()
    hot_key(store, chains.RUN + 1 + chains.NEXT_RUN)

    def decide(item: Outgoing) -> Outcome:
        if item.seq == 3:
            return Outcome(item.seq, Fate.REJECTED, "basic.nack from broker")
        return Outcome(item.seq, Fate.CONFIRMED)

    publisher = FakePublisher(decide=decide, hold=True)
    relay, _ = make_relay(store, publisher, claim_max=500)
    relay.run_once()
    publisher.answer_first()  # 3 failed: the rest of the chain was never sent
    relay.run_once()
    while publisher.held:  # the chain's later chunks, held back whole
        publisher.answer_first()
        relay.run_once()
    assert store.runs_extended == []
    states = store.states()
    assert [states[s] for s in (1, 2, 3)] == ["published", "published", "pending"]
    assert all(states[s] == "pending" for s in range(4, chains.RUN + 2))  # given back, in order


def test_a_database_failure_while_extending_leaves_the_chain_to_end_as_usual() -> None:
    store = FakeStore()
    hot_key(store, chains.RUN + 1 + 10)
    publisher = FakePublisher(hold=True)
    relay, clock = make_relay(store, publisher, claim_max=500)
    relay.run_once()
    store.fail_next.append("claim_run")
    while "claim_run" in store.fail_next:  # until the chain is short enough to be extended
        publisher.answer_first()
        relay.run_once()  # the extension fails: logged, claims (and settling) back off
    assert store.runs_extended == []
    clock.now += 5.0  # past the pause
    drain_piece_by_piece(relay, publisher)
    for _ in range(20):  # the rest is claimed the usual way once the chain is marked
        relay.run_once()
        if publisher.held:
            publisher.confirm_held()
    assert set(store.states().values()) == {"published"}
