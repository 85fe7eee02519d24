"""The loop at its edges: suspects go out alone, no batch lives for ever, a stuck loop is seen
and a failure in the broker's IO ends it, a half-written settlement is not counted twice,
retention cannot stop the loop, and a crash gives up what was sent as an expired lease would."""

from __future__ import annotations

import datetime as dt

import pytest

from relay.core.outcome import Fate, Outcome
from relay.core.retention import RetentionPolicy
from relay.ports import Claimed, Outgoing, RetentionFailed
from relay.runtime.health import HealthServer
from tests.unit.fakes import FakePublisher, FakeStore, make_claimed
from tests.unit.test_relay_loop import make_relay


def test_a_suspect_is_published_alone_and_nothing_is_claimed_beside_it() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in (1, 2, 3)))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher, claim_max=3)
    relay.run_once()
    assert len(publisher.published) == 3
    # A suspect comes back (its relay died): claimed, but held until the batch in flight settles.
    store.add(make_claimed(4, suspect=True), make_claimed(5))
    relay.claimer.claim_soon()
    relay.run_once()
    assert store.states()[4] == "in_flight"
    assert len(publisher.published) == 3
    publisher.confirm_held()
    relay.run_once()  # settles 1-3, then sends the suspect on its own
    assert [i.seq for i in publisher.published[3:]] == [4]
    assert store.states()[5] == "pending"
    relay.claimer.claim_soon()
    relay.run_once()  # nothing beside it while it flies
    assert store.states()[5] == "pending"
    assert len(publisher.published) == 4
    publisher.confirm_held()
    relay.run_once()
    relay.claimer.claim_soon()
    relay.run_once()
    assert store.states() == {1: "published", 2: "published", 3: "published",
                              4: "published", 5: "in_flight"}  # fmt: skip


def test_a_batch_without_outcomes_is_retried_after_its_life_without_charging_it() -> None:
    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2))
    publisher = FakePublisher(hold=True)  # a bug lost the answer: `done` never comes
    relay, clock = make_relay(store, publisher, confirm_timeout=2.0, lease_seconds=5.0)
    relay.run_once()
    assert relay.in_flight == 2
    clock.now += 5.9  # 3 x confirm timeout not yet over
    relay.run_once()
    assert relay.in_flight == 2
    clock.now += 0.2
    relay.run_once()  # gives the batch up
    relay.run_once()  # and settles it
    assert relay.in_flight == 0
    assert store.states() == {1: "pending", 2: "pending"}
    assert all(r.burned == 0 for r in store.rows.values())
    # The publisher's late answer finds no lease: it changes nothing.
    publisher.confirm_held()
    relay.run_once()
    assert store.states() == {1: "pending", 2: "pending"}


def test_a_loop_that_stops_turning_makes_healthz_fail() -> None:
    publisher = FakePublisher()
    relay, clock = make_relay(FakeStore(), publisher)
    health = HealthServer(
        "127.0.0.1",
        0,
        heartbeat=lambda: relay.heartbeat,
        stale_after=30.0,
        database=lambda: None,
        broker_ready=lambda: publisher.ready,
        registry=None,
        clock=clock,
        problem=relay.problem,
    )
    try:
        assert health.answer("/healthz")[0] == 200
        clock.now += 31  # stuck in a call: the loop has not turned since
        status, _, body = health.answer("/healthz")
        assert status == 503
        assert b"stalled" in body
    finally:
        health.stop()


class BrokenIO(FakePublisher):
    """The broker's IO raises (a bug in a callback): the loop must not go on without it."""

    def wait(self, timeout: float) -> None:
        raise RuntimeError("a callback raised")


def test_a_failure_in_the_brokers_io_ends_the_loop_and_gives_the_rows_back() -> None:
    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2))
    relay, _ = make_relay(store, BrokenIO(hold=True))
    with pytest.raises(RuntimeError, match="a callback raised"):
        relay.run()
    relay.release_all("relay crashed")
    assert relay.in_flight == 0
    assert set(store.states().values()) == {"pending"}


class FailSecondResource(FakeStore):
    """The database fails once, on the second resource a settlement writes."""

    writes = 0

    def change_resource(self, resource, change):  # type: ignore[no-untyped-def]
        self.writes += 1
        if self.writes == 2:
            self.fail_next.append("change_resource")
        return super().change_resource(resource, change)


def test_a_settlement_retried_after_a_database_failure_counts_each_circuit_once() -> None:
    store = FailSecondResource()
    store.add(make_claimed(1, exchange="a"), make_claimed(2, exchange="b"))

    def missing(item: Outgoing) -> Outcome:
        return Outcome(item.seq, Fate.DESTINATION_MISSING, "404 NOT_FOUND")

    relay, clock = make_relay(store, FakePublisher(decide=missing), claim_max=10)
    relay.run_once()
    relay.run_once()  # the second circuit's write fails: the settlement waits
    clock.now += 5.0  # past the database's pause
    relay.run_once()  # and is written now
    failures = {name.rsplit("/", 1)[1]: row.circuit.failures
                for name, row in store.resource_rows.items()}  # fmt: skip
    assert failures == {"a": 1, "b": 1}
    assert store.states() == {1: "pending", 2: "pending"}


class FailingRetention(FakeStore):
    def purge_expired(self, policy: RetentionPolicy, now: dt.datetime) -> int:
        raise RetentionFailed("permission denied for table outbox_message")


def test_a_retention_failure_of_any_kind_does_not_stop_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FailingRetention()
    store.add(make_claimed(1))
    relay, _ = make_relay(store, FakePublisher())
    relay.run_once()
    relay.run_once()
    assert store.states() == {1: "published"}
    assert "relay.retention_failed" in caplog.text


class CrashOnSecondClaim(FakeStore):
    claims = 0

    def claim(self, **kwargs: object) -> list[Claimed]:
        self.claims += 1
        if self.claims == 2:
            raise RuntimeError("a bug we have not imagined yet")
        return super().claim(**kwargs)  # type: ignore[arg-type]


def test_a_crash_abandons_what_was_sent_and_releases_what_was_not() -> None:
    store = CrashOnSecondClaim()
    store.add(make_claimed(1), make_claimed(2))
    relay, _ = make_relay(store, FakePublisher(hold=True), claim_max=1, real_clock=True)
    with pytest.raises(RuntimeError):
        relay.run()
    relay.release_all("relay crashed")
    assert store.states() == {1: "pending", 2: "pending"}
    assert (store.rows[1].abandoned, store.rows[1].released) == (1, 0)


def test_a_clean_stop_releases_without_abandoning() -> None:
    store = FakeStore()
    store.add(make_claimed(1))
    publisher = FakePublisher(hold=True)
    relay, _ = make_relay(store, publisher)
    relay.run_once()
    assert relay.release_all("stopping") == 1
    assert (store.rows[1].abandoned, store.rows[1].released) == (0, 1)
