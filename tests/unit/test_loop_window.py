"""The publisher's window and continuous marking, against fakes: few messages wait for a confirm at
any moment, and each answered chunk is marked at the next pass, not when its whole claim is done."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from relay.core.outcome import Fate, Outcome
from tests.unit.fakes import FakePublisher, FakeStore, make_claimed
from tests.unit.test_relay_loop import make_relay


def answer(publisher: FakePublisher, chunks: int) -> None:
    """The broker confirms the first `chunks` chunks the publisher holds."""
    held, publisher.held = publisher.held[:chunks], publisher.held[chunks:]
    for items, done in held:
        done([publisher.decide(i) for i in items])


class CountingStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[uuid.UUID, list[int]]] = []

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        self.marks.append((token, list(seqs)))
        return super().mark_published(token, seqs)


def test_no_more_than_the_window_waits_for_confirms_and_answers_refill_it() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 41)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=20, window=8)
    relay.run_once()
    # One claim of 20; 8 handed over, in chunks of 2 (a quarter of the window).
    assert relay.in_flight == 20
    assert [len(items) for items, _ in publisher.held] == [2, 2, 2, 2]
    assert [i.seq for i in publisher.published] == list(range(1, 9))
    relay.run_once()  # 12 wait, less than a batch: the next batch is claimed to follow
    relay.run_once()
    assert relay.in_flight == 40  # 32 wait now: enough until the window moves
    answer(publisher, 2)
    relay.run_once()  # the answers refill the window, in claim order
    assert [i.seq for i in publisher.published] == list(range(1, 13))
    assert sum(len(items) for items, _ in publisher.held) == 8
    assert [store.rows[i].state for i in (1, 4, 5)] == ["published", "published", "in_flight"]


def test_the_next_batch_is_claimed_while_the_last_one_is_still_going_out() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 101)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=10, window=8)
    relay.run_once()
    assert relay.in_flight == 10  # 8 sent, 2 waiting: less than a batch waits
    relay.run_once()
    assert relay.in_flight == 20  # so the next is claimed, and waits in memory
    relay.run_once()
    assert relay.in_flight == 20  # 12 waiting now: enough until the window moves
    assert len(publisher.published) == 8


def test_confirmed_rows_are_marked_as_their_chunks_are_answered() -> None:
    store = CountingStore()
    store.add(*(make_claimed(i) for i in range(1, 11)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=10, window=100)
    relay.run_once()
    answer(publisher, 1)  # the first chunk of the claim: rows 1-10 are one chunk here
    assert len(publisher.held) == 0
    relay.run_once()
    assert store.states() == dict.fromkeys(range(1, 11), "published")
    store2 = CountingStore()
    store2.add(*(make_claimed(i) for i in range(1, 201)))
    publisher2 = FakePublisher(hold=True)
    relay2, _ = make_relay(store2, publisher2, claim_max=200, window=256)
    relay2.run_once()
    assert [len(items) for items, _ in publisher2.held] == [64, 64, 64, 8]
    answer(publisher2, 1)
    relay2.run_once()  # marked while the rest of the claim still waits for the broker
    assert sum(s == "published" for s in store2.states().values()) == 64
    assert relay2.in_flight == 136
    answer(publisher2, 3)  # three chunks answered between two passes: one UPDATE for them
    relay2.run_once()
    assert [len(seqs) for _, seqs in store2.marks] == [64, 136]
    assert relay2.in_flight == 0


def test_a_failed_chunk_is_decided_alone_and_the_rest_of_its_claim_goes_on() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 9)))

    def decide(item: object) -> Outcome:
        ref = item.seq  # type: ignore[attr-defined]
        return Outcome(ref, Fate.REJECTED, "nack") if ref == 2 else Outcome(ref, Fate.CONFIRMED)

    publisher = FakePublisher(hold=True, decide=decide)
    relay, _ = make_relay(store, publisher, claim_max=8, window=4)  # chunks of 1
    relay.run_once()
    answer(publisher, 2)
    relay.run_once()
    assert (store.rows[1].state, store.rows[2].state) == ("published", "pending")
    assert store.rows[2].burned == 1
    assert relay.in_flight == 6


def test_a_stop_gives_back_at_once_what_was_never_sent() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 21)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(
        store, publisher, real_clock=True, claim_max=20, window=4, drain_timeout=5
    )
    relay.run_once()
    relay.request_stop()
    answer(publisher, 4)  # what was sent is confirmed; nothing else need be waited for
    summary = relay.run()
    states = store.states()
    assert [states[i] for i in range(1, 5)] == ["published"] * 4
    assert [states[i] for i in range(5, 21)] == ["pending"] * 16
    assert all(store.rows[i].released == 1 for i in range(5, 21))
    assert summary.drained
    assert [i.seq for i in publisher.published] == [1, 2, 3, 4]


def test_an_answer_for_a_chunk_given_up_as_overdue_changes_nothing() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 5)))
    publisher = FakePublisher(hold=True)
    relay, clock = make_relay(store, publisher, confirm_timeout=2.0, lease_seconds=5.0, window=2)
    relay.run_once()  # rows 1-2 sent (chunks of one), 3-4 wait
    clock.now += 6.1  # past 3 x the confirm timeout
    relay.run_once()  # the two chunks are given up (no attempt charged), 3 and 4 go out
    relay.run_once()
    assert [store.rows[i].state for i in (1, 2)] == ["pending", "pending"]
    assert [i.seq for i in publisher.published] == [1, 2, 3, 4]
    answer(publisher, 4)  # late answers for 1 and 2, timely ones for 3 and 4
    relay.run_once()
    assert store.states() == {1: "pending", 2: "pending", 3: "published", 4: "published"}
    assert all(r.burned == 0 for r in store.rows.values())


def test_an_answer_keeps_its_room_in_the_window_until_it_is_written() -> None:
    """What is sent and not yet marked is what a relay killed now leaves to be published again:
    the window bounds it, so a database that cannot take the marks stops the sending too."""
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 9)))
    publisher = FakePublisher(hold=True)
    relay, clock = make_relay(store, publisher, claim_max=8, window=4)
    relay.run_once()
    assert len(publisher.published) == 4
    store.fail_next.append("mark")
    answer(publisher, 4)
    relay.run_once()  # confirmed, but the mark failed: nothing more goes out
    assert len(publisher.published) == 4
    assert store.states()[1] == "in_flight"
    clock.now += 5.0  # past the database's pause
    relay.run_once()  # marked now, and the window refills
    assert [store.rows[i].state for i in range(1, 5)] == ["published"] * 4
    assert [i.seq for i in publisher.published] == list(range(1, 9))


def test_rows_waiting_for_the_window_go_back_when_the_broker_cannot_take_them() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 9)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=8, window=2)
    relay.run_once()
    assert relay.in_flight == 8  # 2 sent, 6 waiting
    publisher.ready = False  # the connection is lost: the publisher answers for what it had
    publisher.stop()
    assert relay.run_once().released == 6  # the rest are not held leased through the outage
    assert [store.rows[i].released for i in range(3, 9)] == [1] * 6
    assert relay.in_flight == 0
    assert [i.seq for i in publisher.published] == [1, 2]


def test_a_backlog_grows_the_default_window_and_its_end_shrinks_it() -> None:
    """The loop feeds the window (relay/core/window.py): with every setting at its default, a
    backlog the broker answers a round later grows it from its first size towards ROUND
    seconds of the rate, never past max_in_flight; once the work stops filling it, it
    shrinks."""
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 30_001)))
    publisher = FakePublisher(hold=True)
    relay, clock = make_relay(store, publisher)
    window = relay.claimer.window
    first = window.size
    for _ in range(1_000):  # 5 ms a pass; the broker answers what was held a pass earlier
        answer(publisher, len(publisher.held))
        relay.run_once()
        clock.now += 0.005
    grown = window.size
    assert first < grown <= relay.config.max_in_flight
    while publisher.held or store.states().get(30_000) != "published":
        answer(publisher, len(publisher.held))
        relay.run_once()
        clock.now += 0.005
    for _ in range(400):  # two idle seconds
        relay.run_once()
        clock.now += 0.005
        answer(publisher, len(publisher.held))
    store.add(*(make_claimed(i) for i in range(30_001, 30_011)))  # a trickle
    for _ in range(400):
        answer(publisher, len(publisher.held))
        relay.run_once()
        clock.now += 0.005
    assert window.size < grown


def test_chains_are_held_to_max_in_flight_and_rows_beside_them_to_the_window() -> None:
    """Chains of 30, each taking a chunk: they go up to max_in_flight, past the first window
    (256), and do not count as held back by it (their rounds are one confirm per message, not a
    queue at the broker). Rows to send side by side wait for the window, and do count."""
    store = FakeStore()
    store.add(*(make_claimed(seq, key=f"k{seq % 12}") for seq in range(1, 12 * 30 + 1)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher)
    relay.run_once()
    assert [len(items) for items, _ in publisher.held] == [30] * 12
    assert not relay.claimer.window.limited
    store.add(*(make_claimed(seq) for seq in range(1000, 1100)))
    relay.claimer.claim_soon()
    relay.run_once()
    assert len(publisher.published) == 12 * 30  # the chains fill the window: the rows wait
    assert relay.claimer.window.limited
