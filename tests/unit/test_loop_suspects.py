"""Suspects in the loop (relay/loop/suspects.py): a claim of suspects is a suspect lease, which
holds claiming while the relay has it, goes out only once nothing else is in flight, and is given
up as an expired lease would when the relay crashes after sending it."""

from __future__ import annotations

import uuid
from collections import deque

from relay.loop import suspects
from relay.loop.leases import Lease, Leases
from relay.ports import Claimed
from tests.unit.fakes import FakePublisher, FakeStore, make_claimed
from tests.unit.test_relay_loop import make_relay


def lease(*rows: Claimed, sent_at: float | None = None) -> Lease:
    return Lease(
        uuid.uuid4(),
        {row.seq: row for row in rows},
        0.0,
        unsent=deque(rows),
        sent_at=sent_at,
        suspect=suspects.claimed_apart(rows),
    )


def held(*leases: Lease) -> Leases:
    found = Leases()
    for one in leases:
        found[one.token] = one
    return found


def test_a_claim_of_suspects_is_a_suspect_lease() -> None:
    assert suspects.claimed_apart([make_claimed(1, suspect=True), make_claimed(2, suspect=True)])
    assert not suspects.claimed_apart([make_claimed(1), make_claimed(2)])


def test_claiming_is_quarantined_exactly_while_a_suspect_lease_is_held() -> None:
    ordinary, suspect = lease(make_claimed(1)), lease(make_claimed(2, suspect=True))
    assert not suspects.quarantined(held())
    assert not suspects.quarantined(held(ordinary))
    assert suspects.quarantined(held(ordinary, suspect))
    leases = held(suspect)
    del leases[suspect.token]  # settled or given back: nothing to clear besides
    assert not suspects.quarantined(leases)


def test_suspects_are_sent_only_once_every_row_in_flight_is_theirs() -> None:
    ordinary = lease(make_claimed(1), make_claimed(2))
    suspect = lease(make_claimed(3, suspect=True), make_claimed(4, suspect=True))
    assert suspects.may_send(ordinary, held(ordinary, suspect))
    assert not suspects.may_send(suspect, held(ordinary, suspect))
    assert suspects.may_send(suspect, held(suspect))


def test_a_crash_abandons_only_what_was_sent() -> None:
    sent, unsent = lease(make_claimed(1), sent_at=5.0), lease(make_claimed(2))
    assert suspects.abandon(sent, crashed=True)
    assert not suspects.abandon(unsent, crashed=True)
    assert not suspects.abandon(sent, crashed=False)


def test_a_suspect_lease_given_back_unsent_ends_the_quarantine() -> None:
    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=2)
    relay.run_once()
    store.add(make_claimed(3, suspect=True), make_claimed(4))
    relay.claimer.claim_soon()
    relay.run_once()  # the suspect is claimed, and waits for 1 and 2
    assert store.states()[3] == "in_flight"
    publisher.blocked = True  # the broker cannot take it: given back as it was claimed
    counts = relay.run_once()
    assert counts.released == 1
    assert store.states()[3] == "pending"
    publisher.blocked = False
    publisher.confirm_held()
    relay.run_once()  # 1 and 2 are marked; the suspect is claimed again, and goes alone
    relay.claimer.claim_soon()
    relay.run_once()
    assert [i.seq for i in publisher.published[2:]] == [3]
    assert store.states()[4] == "pending"
    publisher.confirm_held()
    relay.run_once()
    relay.claimer.claim_soon()
    relay.run_once()  # the quarantine is over: the rest goes on
    assert store.states() == {1: "published", 2: "published", 3: "published", 4: "in_flight"}
