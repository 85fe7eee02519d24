"""The heartbeat against fakes: registered before any claim, claims held back while it is not
fresh, an earlier run's rows taken back once, and a relay declared dead gives back what it holds
and carries on instead of crashing.

The pulse's thread beats every `heartbeat_interval` of real time; these tests set it far beyond
their length and drive each beat themselves (`beat_once`) on the relay's fake clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from relay.errors import DatabaseUnavailable
from relay.loop.relay import Relay
from tests.unit.fakes import FakePublisher, FakeStore, make_claimed
from tests.unit.test_relay_loop import Clock, make_relay

SLOW = {"heartbeat_interval": 100.0, "dead_after": 300.0}  # fresh for 150 s after a beat


class LivenessStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.owner_reclaims = 0
        self.dead: list[str] = []  # relays the next reclaim_dead finds dead
        self.broken: Exception | None = None  # raised by every beat

    def reclaim_owner(self, relay_id: str, *, max_attempts: int = 10) -> int:
        self.owner_reclaims += 1
        return 3

    def reclaim_dead(
        self, *, relay_id: str, dead_after: float, max_attempts: int = 10
    ) -> tuple[list[str], int]:
        found, self.dead = self.dead, []
        return found, 5 * len(found)

    def beat(self, relay_id: str, started_at: dt.datetime) -> bool:
        if self.broken is not None:
            raise self.broken
        return super().beat(relay_id, started_at)


@pytest.fixture
def running() -> Iterator[list[Relay]]:
    relays: list[Relay] = []
    yield relays
    for relay in relays:
        relay.pulse.stop()


def started(
    store: FakeStore,
    publisher: FakePublisher,
    running: list[Relay],
    window: int | None = None,
    **config: object,
) -> tuple[Relay, Clock]:
    relay, clock = make_relay(store, publisher, window=window, **{**SLOW, **config})  # type: ignore[arg-type]
    relay.pulse.start()
    running.append(relay)
    return relay, clock


def test_a_relay_registers_and_takes_back_its_earlier_run_before_it_claims(
    running: list[Relay],
) -> None:
    store = LivenessStore()
    store.add(make_claimed(1))
    relay, clock = started(store, FakePublisher(), running)
    assert store.owner_reclaims == 1
    assert "test" in store.runs
    assert relay.run_once().claimed == 1
    clock.now += 10
    relay.pulse.beat_once()
    assert store.owner_reclaims == 1  # only the first registration


def test_nothing_is_claimed_or_sent_while_the_heartbeat_is_not_fresh(
    running: list[Relay],
) -> None:
    store = LivenessStore()
    store.add(*(make_claimed(i) for i in range(1, 5)))
    publisher = FakePublisher(hold=True)
    relay, clock = started(store, publisher, running, claim_max=2, window=1)
    relay.run_once()
    assert len(publisher.published) == 1  # row 1 sent, row 2 waits for the window
    store.fail_next.append("beat")
    clock.now += 100
    relay.pulse.beat_once()  # fails: the last good beat is 100 s old, still fresh
    clock.now += 60  # 160 s: others could take this relay's leases in 140 s
    publisher.confirm_held()
    relay.claimer.claim_soon()
    assert relay.run_once().claimed == 0
    assert len(publisher.published) == 1  # row 2 is not sent either
    assert relay._wait_time() == relay.config.poll_interval  # no spinning meanwhile
    relay.pulse.beat_once()  # good again: claims and sends go on
    relay.run_once()
    assert [i.seq for i in publisher.published] == [1, 2]


def test_a_relay_declared_dead_gives_back_what_it_holds_and_carries_on(
    running: list[Relay], caplog: pytest.LogCaptureFixture
) -> None:
    store = LivenessStore()
    store.add(*(make_claimed(i) for i in range(1, 5)))
    publisher = FakePublisher(hold=True)
    relay, clock = started(store, publisher, running, claim_max=4, window=2)
    relay.run_once()
    assert relay.in_flight == 4
    del store.runs["test"]  # another relay found the heartbeat stopped and took the row
    clock.now += 100
    relay.pulse.beat_once()
    assert not relay.pulse.fresh(clock.now)
    relay.run_once()  # the loop hears it: everything goes back, nothing is claimed
    assert relay.in_flight == 0
    assert store.states() == dict.fromkeys(range(1, 5), "pending")
    assert all(store.rows[i].released == 1 for i in range(1, 5))
    assert "relay.declared_dead" in caplog.text
    publisher.confirm_held()  # the broker's late answers for the leases given back
    relay.run_once()
    assert store.states() == dict.fromkeys(range(1, 5), "pending")  # they change nothing
    relay.pulse.beat_once()  # registers anew, and claims go on
    assert "test" in store.runs
    for _ in range(4):
        relay.run_once()
        publisher.confirm_held()
    relay.run_once()
    assert store.states() == dict.fromkeys(range(1, 5), "published")
    assert store.owner_reclaims == 1  # its own rows were given back, not reclaimed as a crash's


def test_dead_relays_found_by_the_heartbeat_wake_the_loop(running: list[Relay]) -> None:
    store = LivenessStore()
    relay, _ = started(store, FakePublisher(), running, poll_interval=5.0)
    relay.run_once()  # nothing to claim: the next look is seconds away
    store.add(make_claimed(1))
    assert relay.run_once().claimed == 0
    store.dead = ["crashed:1"]
    relay.pulse.beat_once()  # its rows came back: look now
    assert relay.run_once().claimed == 1


def test_a_heartbeat_that_keeps_failing_fails_healthz_unless_the_database_is_down(
    running: list[Relay],
) -> None:
    store = LivenessStore()
    relay, clock = started(store, FakePublisher(), running)
    store.broken = DatabaseUnavailable("database is down")
    clock.now += 400
    relay.pulse.beat_once()
    assert relay.problem() is None  # an outage: /readyz says so, the process is fine
    store.broken = PermissionError("permission denied for table outbox_relay")
    relay.pulse.beat_once()
    problem = relay.problem()
    assert problem is not None
    assert "heartbeat has failed" in problem
    assert "permission denied" in problem
    store.broken = None
    relay.pulse.beat_once()
    assert relay.problem() is None


def test_after_its_own_heartbeat_failed_a_relay_takes_no_one_for_dead_for_a_while(
    running: list[Relay],
) -> None:
    """A database outage stops every relay's heartbeat: whoever beats first when it ends must
    not take the others' leases before they have had the time to beat again."""
    store = LivenessStore()
    relay, clock = started(store, FakePublisher(), running)
    store.dead = ["other:1"]
    store.fail_next.append("beat")
    clock.now += 100
    relay.pulse.beat_once()  # the outage
    clock.now += 100
    relay.pulse.beat_once()  # back: but "other:1" may only have been out as long
    assert store.dead == ["other:1"]  # not asked
    clock.now += 299
    relay.pulse.beat_once()
    assert store.dead == ["other:1"]
    clock.now += 1  # dead_after (300 s here) of good beats since: judged again
    relay.pulse.beat_once()
    assert store.dead == []
