"""The relay loop with circuits and rate limits, against the in-memory store and publisher."""

from __future__ import annotations

import datetime as dt
import random

from relay.core.circuit import CircuitSettings, CircuitState
from relay.core.outcome import Fate, Outcome
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.ports import Outgoing
from relay.runtime.config import RelayConfig
from tests.unit.fakes import FakePublisher, FakeStore, make_claimed

SETTINGS = CircuitSettings(threshold=3, cooldown=10.0, max_cooldown=60.0, probe_timeout=60.0)
BROKER = "localhost:5672/%2F"


class Wall:
    def __init__(self, store: FakeStore) -> None:
        self.store = store

    def __call__(self) -> dt.datetime:
        return self.store.now

    def advance(self, seconds: float) -> None:
        self.store.now += dt.timedelta(seconds=seconds)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    store: FakeStore,
    publisher: FakePublisher,
    relay_id: str = "r1",
    *,
    clock: Clock | None = None,
    **config: object,
) -> Relay:
    cfg = RelayConfig(
        db_url="sqlite://",
        relay_id=relay_id,
        circuit=SETTINGS,
        circuit_refresh=0.001,
        **config,  # type: ignore[arg-type]
    )
    return wire_relay(
        store, publisher, cfg, clock=clock or Clock(), wall=Wall(store), rng=random.Random(3)
    )


def add(store: FakeStore, exchange: str, seqs: range) -> None:
    store.add(*(make_claimed(s, exchange=exchange) for s in seqs))


class Broken:
    """A publisher decision: one exchange answers 404 until it is repaired."""

    def __init__(self, exchange: str) -> None:
        self.exchange = exchange
        self.broken = True

    def __call__(self, item: Outgoing) -> Outcome:
        if self.broken and item.exchange == self.exchange:
            return Outcome(item.seq, Fate.DESTINATION_MISSING, "404 NOT_FOUND - no exchange")
        return Outcome(item.seq, Fate.CONFIRMED)


def drive(relay: Relay, passes: int = 6) -> None:
    for _ in range(passes):
        relay.run_once()
        relay.claimer.claim_soon()


def circuit_state(store: FakeStore, exchange: str) -> CircuitState:
    return store.resource_rows[f"{BROKER}/{exchange}"].circuit.state


def test_a_broken_exchange_opens_its_circuit_and_stops_taking_places_in_batches() -> None:
    store = FakeStore()
    add(store, "bad", range(1, 6))  # five failures: three burn and open it, two are free
    add(store, "good", range(100, 105))
    broken = Broken("bad")
    relay = make(store, FakePublisher(decide=broken), claim_max=10)
    drive(relay)
    assert circuit_state(store, "bad") is CircuitState.OPEN
    assert [store.rows[s].burned for s in range(1, 6)] == [1, 1, 1, 0, 0]
    assert all(store.rows[s].state == "published" for s in range(100, 105))

    # While it is open, new messages for it are never claimed; the healthy ones flow.
    add(store, "bad", range(6, 9))
    add(store, "good", range(200, 230))
    drive(relay)
    assert all(store.rows[s].state == "published" for s in range(200, 230))
    assert [store.rows[s].state for s in range(6, 9)] == ["pending"] * 3
    assert not any(p.seq in (6, 7, 8) for p in relay.publisher.published)  # type: ignore[attr-defined]


def test_after_the_cooldown_one_message_probes_and_its_confirm_closes_the_circuit() -> None:
    store = FakeStore()
    add(store, "bad", range(1, 4))
    broken = Broken("bad")
    publisher = FakePublisher(decide=broken)
    relay = make(store, publisher)
    drive(relay)
    assert circuit_state(store, "bad") is CircuitState.OPEN
    add(store, "bad", range(10, 20))
    Wall(store).advance(11)  # past the cooldown (10 s, half of it jittered)
    broken.broken = False
    sent_before = len(publisher.published)
    relay.run_once()  # probe: exactly one message of the resource, alone
    probes = publisher.published[sent_before:]
    assert [p.exchange for p in probes] == ["bad"]
    drive(relay)
    assert circuit_state(store, "bad") is CircuitState.CLOSED
    assert all(store.rows[s].state == "published" for s in range(10, 20))


def test_a_failed_probe_reopens_for_longer_and_burns_nothing() -> None:
    store = FakeStore()
    add(store, "bad", range(1, 4))
    relay = make(store, FakePublisher(decide=Broken("bad")))
    drive(relay)
    first = store.resource_rows[f"{BROKER}/bad"].circuit
    add(store, "bad", range(10, 12))
    Wall(store).advance(11)
    drive(relay, passes=3)
    again = store.resource_rows[f"{BROKER}/bad"].circuit
    assert again.state is CircuitState.OPEN
    assert again.opens == first.opens + 1
    assert [store.rows[s].burned for s in (10, 11)] == [0, 0]


def test_two_relays_share_one_circuit_and_only_one_probes() -> None:
    store = FakeStore()
    add(store, "bad", range(1, 4))
    p1 = FakePublisher(decide=Broken("bad"))
    p2 = FakePublisher(decide=Broken("bad"))
    r1, r2 = make(store, p1, "r1"), make(store, p2, "r2")
    drive(r1)
    assert circuit_state(store, "bad") is CircuitState.OPEN
    add(store, "bad", range(10, 20))
    drive(r2)  # r2 never saw a failure, yet passes the resource by
    assert p2.published == []
    Wall(store).advance(11)
    p1.hold = p2.hold = True  # the probe is in flight while both relays look
    for _ in range(3):
        r1.run_once()
        r2.run_once()
    probers = [p for p in (p1, p2) if p.held]
    assert len(probers) == 1
    assert sum(len(items) for items, _ in probers[0].held) == 1
    assert store.resource_rows[f"{BROKER}/bad"].circuit.probe_owner in ("r1", "r2")


def test_connection_losses_open_no_circuit() -> None:
    store = FakeStore()
    add(store, "ex", range(1, 10))

    def lost(item: Outgoing) -> Outcome:
        return Outcome(item.seq, Fate.UNCONFIRMED, "connection closed", connection_lost=True)

    relay = make(store, FakePublisher(decide=lost))
    drive(relay, passes=2)
    assert store.resource_rows == {}
    # ...and cost no attempt: the message was not at fault (the reconnect has its own backoff).
    assert all(store.rows[s].state == "pending" for s in range(1, 10))
    assert [store.rows[s].burned for s in range(1, 10)] == [0] * 9


def test_a_rate_limited_resource_gets_its_tokens_and_the_rest_flows_freely() -> None:
    store = FakeStore()
    add(store, "slow", range(1, 101))
    add(store, "fast", range(1000, 1100))
    publisher = FakePublisher()
    clock = Clock()
    relay = make(store, publisher, clock=clock, rate_limits={"slow": 10.0}, claim_max=500)
    drive(relay, passes=3)
    slow_sent = sum(1 for s in range(1, 101) if store.rows[s].state == "published")
    assert slow_sent == 10  # a full bucket: one second's worth
    assert all(store.rows[s].state == "published" for s in range(1000, 1100))
    Wall(store).advance(2.0)
    clock.now += 2.0
    drive(relay, passes=3)
    slow_sent = sum(1 for s in range(1, 101) if store.rows[s].state == "published")
    assert slow_sent == 20  # refilled at 10 per second, capped at the burst


def test_circuit_changes_and_failures_are_counted_in_metrics() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from relay.runtime.telemetry import Telemetry

    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    store = FakeStore()
    add(store, "bad", range(1, 6))
    add(store, "good", range(10, 13))
    cfg = RelayConfig(db_url="sqlite://", relay_id="r1", circuit=SETTINGS)
    relay = wire_relay(
        store,
        FakePublisher(decide=Broken("bad")),
        cfg,
        clock=Clock(),
        wall=Wall(store),
        rng=random.Random(3),
        telemetry=telemetry,
    )
    drive(relay)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[tuple[dict[str, object], float]]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", getattr(point, "count", 0))
                    points.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    assert points["outbox.circuit.transitions"] == [
        ({"resource": f"{BROKER}/bad", "state": "open"}, 1)
    ]
    failed = {(a["outcome"], a["exchange"]): v for a, v in points["outbox.messages.failed"]}
    assert failed == {("retry", "bad"): 3, ("deferred", "bad"): 2}
    assert points["outbox.messages.published"] == [({"exchange": "good"}, 3)]
    assert ({"resource": f"{BROKER}/bad"}, 2) in points["outbox.circuit.state"]
    assert ({"state": "pending", "estimated": "false"}, 5) in points["outbox.messages"]
