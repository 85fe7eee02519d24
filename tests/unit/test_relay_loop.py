"""The relay loop against fakes at its port boundary: what it marks, releases and keeps."""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time

import pytest

from relay.core.outcome import Fate, Outcome
from relay.core.policy import RetryPolicy
from relay.core.window import Window
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.ports import Outgoing
from relay.runtime.config import RelayConfig
from tests.unit.fakes import EPOCH, FakePublisher, FakeStore, make_claimed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_relay(
    store: FakeStore,
    publisher: FakePublisher,
    *,
    real_clock: bool = False,
    window: int | None = None,
    **config: object,
) -> tuple[Relay, Clock]:
    """A relay on fakes; `window`: a window of that size, fixed (its sizing is
    tests/unit/test_window.py's)."""
    clock = Clock()
    cfg = RelayConfig(db_url="sqlite://", relay_id="test", **config)  # type: ignore[arg-type]
    relay = wire_relay(
        store,
        publisher,
        cfg,
        clock=time.monotonic if real_clock else clock,
        wall=lambda: EPOCH + dt.timedelta(minutes=1),
        rng=random.Random(5),
    )
    if window is not None:
        relay.claimer.window = Window(window, start=window, floor=window)
    return relay, clock


def test_confirmed_rows_are_marked_and_failures_decided_by_the_policy() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 6)))

    def decide(item: Outgoing) -> Outcome:
        if item.seq == 2:
            return Outcome(item.seq, Fate.UNROUTABLE, "312 NO_ROUTE")
        if item.seq == 3:
            return Outcome(item.seq, Fate.REJECTED, "nack")
        return Outcome(item.seq, Fate.CONFIRMED)

    # Unroutable is permanent, here with no grace: dead with its reason; a nack is retried later.
    no_grace = RetryPolicy(unroutable_grace=0.0)
    relay, _ = make_relay(store, FakePublisher(decide=decide), policy=no_grace)
    first = relay.run_once()
    assert first.claimed == 5
    second = relay.run_once()  # settles what the publisher reported
    assert (second.published, second.retried, second.dead) == (3, 1, 1)
    assert store.states() == {
        1: "published", 2: "dead", 3: "pending", 4: "published", 5: "published"
    }  # fmt: skip
    assert store.rows[2].error == "unroutable (permanent): 312 NO_ROUTE"
    assert store.rows[3].burned == 1
    assert store.history == [(2, "test", "Dead"), (3, "test", "Retry")] or sorted(
        store.history
    ) == [(2, "test", "Dead"), (3, "test", "Retry")]
    assert relay.in_flight == 0


def test_in_flight_is_bounded_by_max_in_flight() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 101)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=10, max_in_flight=25)
    for _ in range(10):
        relay.run_once()
    assert relay.in_flight == 25  # 10 + 10 + 5, then no room
    assert len(publisher.published) == 25
    publisher.confirm_held()
    relay.run_once()
    assert sum(1 for s in store.states().values() if s == "published") == 25


def test_hot_keys_runs_stay_within_max_in_flight() -> None:
    """A claim's heads and the runs behind them together never take the relay past
    max_in_flight: ten heads of twenty hot keys, and five rows of their runs."""
    store = FakeStore()
    store.add(*(make_claimed(i, key=f"k{i % 20}") for i in range(1, 401)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=10, max_in_flight=15)
    for _ in range(10):
        relay.run_once()
        assert relay.in_flight <= 15
    assert relay.in_flight == 15


def test_outcomes_survive_a_database_outage_and_are_marked_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2))
    relay, clock = make_relay(store, FakePublisher())
    relay.run_once()
    store.fail_next.append("mark")
    failed = relay.run_once()
    assert failed.published == 0
    assert store.states() == {1: "in_flight", 2: "in_flight"}
    relay.run_once()  # the database rests: the marks wait for its pause, and log nothing
    assert store.states() == {1: "in_flight", 2: "in_flight"}
    clock.now += 5.0
    relay.run_once()
    assert store.states() == {1: "published", 2: "published"}
    assert relay.summary.published == 2  # counted once, when they were marked
    errors = [r for r in caplog.records if r.getMessage() == "relay.db_error"]
    assert [getattr(r, "during", None) for r in errors] == ["settle"]  # the outage, reported once


def test_a_claim_failure_backs_off_instead_of_spinning() -> None:
    store = FakeStore(fail_next=["claim"])
    store.add(make_claimed(1))
    relay, clock = make_relay(store, FakePublisher())
    assert relay.run_once().claimed == 0
    assert relay.run_once().claimed == 0  # still backing off: the clock has not moved
    clock.now += 1.0
    assert relay.run_once().claimed == 1


def test_a_malformed_row_is_dead_lettered_with_its_reason_and_the_rest_go_out() -> None:
    store = FakeStore()
    store.add(make_claimed(1, headers=["not", "a", "mapping"]), make_claimed(2))
    publisher = FakePublisher()
    relay, _ = make_relay(store, publisher)
    relay.run_once()
    relay.run_once()
    assert [i.seq for i in publisher.published] == [2]
    assert store.states() == {1: "dead", 2: "published"}
    assert store.rows[1].error is not None
    assert "malformed" in store.rows[1].error


def test_no_claims_while_the_publisher_is_not_ready() -> None:
    store = FakeStore()
    store.add(make_claimed(1))
    relay, _ = make_relay(store, FakePublisher(ready=False))
    assert relay.run_once().claimed == 0
    assert store.states() == {1: "pending"}


def test_no_claims_while_the_broker_blocks_publishers() -> None:
    store = FakeStore()
    store.add(make_claimed(1))
    publisher = FakePublisher(blocked=True)
    relay, _ = make_relay(store, publisher)
    assert relay.run_once().claimed == 0
    publisher.blocked = False
    assert relay.run_once().claimed == 1


def test_backpressure_and_never_sent_defer_without_burning_attempts() -> None:
    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2), make_claimed(3))

    def decide(item: Outgoing) -> Outcome:
        if item.seq == 1:
            return Outcome(1, Fate.UNCONFIRMED, "confirm timeout", while_blocked=True)
        if item.seq == 2:
            return Outcome(2, Fate.NOT_SENT, "no open channel")
        return Outcome(3, Fate.UNCONFIRMED, "connection lost")

    relay, _ = make_relay(store, FakePublisher(decide=decide))
    relay.run_once()
    relay.run_once()
    assert store.states() == {1: "pending", 2: "pending", 3: "pending"}
    assert [store.rows[i].burned for i in (1, 2, 3)] == [0, 0, 1]  # only the ambiguous one
    assert relay.summary.failures == {"backpressure": 1, "never_sent": 1, "ambiguous": 1}
    # The stop summary tells the two apart: only the ambiguous one was a retry.
    assert (relay.summary.retried, relay.summary.deferred) == (1, 2)


def test_idle_relay_waits_for_the_poll_interval_unless_woken() -> None:
    store = FakeStore()
    relay, _ = make_relay(store, FakePublisher(), poll_interval=5.0)
    relay.run_once()  # empty claim: next one in 5 s
    store.add(make_claimed(1))
    assert relay.run_once().claimed == 0
    relay.wake()
    assert relay.run_once().claimed == 1


def test_stop_drains_confirms_then_releases_what_was_not_confirmed() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 4)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, real_clock=True, drain_timeout=0.2)
    relay.run_once()
    assert store.states() == {1: "in_flight", 2: "in_flight", 3: "in_flight"}
    relay.request_stop()
    summary = relay.run()  # nothing confirms within the drain timeout
    assert publisher.stopped
    assert store.states() == {1: "pending", 2: "pending", 3: "pending"}
    assert summary.published == 0


def test_stop_waits_for_in_flight_confirms() -> None:
    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, real_clock=True, drain_timeout=10)
    relay.run_once()
    relay.request_stop()
    timer = threading.Timer(0.05, publisher.confirm_held)
    timer.start()
    summary = relay.run()
    timer.join()
    assert store.states() == {1: "published", 2: "published"}
    assert summary.drained


def test_a_full_window_waits_for_a_settlement_instead_of_spinning() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 30)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=10, max_in_flight=10, poll_interval=0.5)
    relay.run_once()
    assert relay.in_flight == 10
    assert relay._wait_time() == 0.5  # blocks on the inbox; a finished batch wakes it


def test_a_blocked_broker_is_waited_out_not_polled_in_a_loop() -> None:
    store = FakeStore()
    relay, _ = make_relay(store, FakePublisher(blocked=True), poll_interval=0.5)
    relay.run_once()
    assert relay._wait_time() == 0.5


def test_a_row_held_with_nothing_to_settle_it_is_given_back_at_the_next_upkeep(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The safety net under bugs like a chain's piece dropping a row from its answer: such a row
    # would keep its lease, extended at every upkeep, and its key behind it, for ever.
    store = FakeStore()
    store.add(*(make_claimed(i, key="k") for i in (1, 2)), make_claimed(3))
    publisher = FakePublisher(hold=True)
    relay, clock = make_relay(store, publisher)
    relay.run_once()
    assert relay.in_flight == 3
    lease = next(iter(relay._leases.values()))
    for chunk in lease.chunks.values():  # a bug: row 2 vanishes from what was handed over
        if 2 in chunk.seqs:
            chunk.seqs.remove(2)
    counts = relay.run_once()  # no upkeep due yet: nothing is looked at
    assert store.states()[2] == "in_flight"
    orphan_id = str(lease.rows[2].id)
    clock.now = relay.maintenance.next_upkeep
    with caplog.at_level(logging.ERROR, logger="relay"):
        counts = relay.run_once()
    assert counts.released == 1
    (said,) = [r for r in caplog.records if r.getMessage() == "relay.orphaned_rows"]
    assert (said.__dict__["messages"], said.__dict__["ids"]) == (1, orphan_id)
    assert store.states()[2] == "pending"
    assert relay.in_flight == 2  # the others are still the publisher's to answer
    publisher.confirm_held()
    relay.run_once()  # 1 and 3 are marked; 2, given back, is claimed anew and sent
    publisher.confirm_held()
    relay.run_once()
    assert store.states() == dict.fromkeys((1, 2, 3), "published")
    assert relay.in_flight == 0
