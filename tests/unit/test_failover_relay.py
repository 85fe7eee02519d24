"""The relay through a database failover, against fakes: a claim whose answer the outage lost is
taken back as soon as the database answers again (not when its lease runs out), /metrics reports
what it knows while the database is down and says so in one line per outage, and the loop's
engine names the server a new connection reached when it changes."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterator, Sequence
from types import SimpleNamespace

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest

from relay.errors import DatabaseUnavailable
from relay.loop.observer import Observer
from relay.ports import Claimed, StateCounts
from relay.store import engines
from tests.unit.fakes import FakePublisher, FakeStore, make_claimed
from tests.unit.test_relay_loop import make_relay


class LostAnswerStore(FakeStore):
    """A claim the database makes whose answer never reaches the relay (the server died, or a
    standby that is promoted next received it, before the answer was sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next_claim = False

    def claim(self, *args: object, **kwargs: object) -> list[Claimed]:
        claimed = super().claim(*args, **kwargs)  # type: ignore[arg-type]
        if self.lose_next_claim:
            self.lose_next_claim = False
            raise DatabaseUnavailable("connection lost during the claim's commit (fake)")
        return claimed


def test_a_claim_whose_answer_was_lost_is_taken_back_once_the_database_answers() -> None:
    store = LostAnswerStore()
    store.add(*(make_claimed(i, key="k") for i in (1, 2)), make_claimed(3))
    publisher = FakePublisher()
    relay, clock = make_relay(store, publisher)
    store.lose_next_claim = True
    relay.run_once()
    assert set(store.states().values()) == {"in_flight"}
    assert relay.in_flight == 0  # the relay never heard of that lease
    clock.now += 5.0  # past the claims' back-off, far within the lease (30 s)
    assert relay.run_once().reclaimed == 3
    for _ in range(10):
        clock.now += 1.0
        relay.run_once()
    assert store.states() == {1: "published", 2: "published", 3: "published"}
    sent = [item.seq for item in publisher.published]
    assert sorted(sent) == [1, 2, 3]  # each once: the lost claim sent nothing
    assert sent.index(1) < sent.index(2)  # the key's order


def test_strays_spare_the_leases_the_relay_holds() -> None:
    store = LostAnswerStore()
    store.add(make_claimed(1), make_claimed(2))
    publisher = FakePublisher(hold=True)  # sent, not confirmed yet
    relay, clock = make_relay(store, publisher)
    relay.run_once()
    assert relay.in_flight == 2
    store.add(make_claimed(3))
    store.lose_next_claim = True
    clock.now += 1.0
    relay.claimer.claim_soon()
    relay.run_once()
    assert store.states()[3] == "in_flight"
    clock.now += 5.0
    assert relay.run_once().reclaimed == 1  # row 3 only
    assert not store.rows[1].suspect
    assert not store.rows[2].suspect
    publisher.confirm_held()
    for _ in range(5):
        clock.now += 1.0
        relay.run_once()
        publisher.confirm_held()
    assert store.states() == {1: "published", 2: "published", 3: "published"}


def test_without_a_database_failure_nothing_is_looked_for() -> None:
    store = FakeStore()
    relay, clock = make_relay(store, FakePublisher())
    store.fail_next.append("reclaim_strays")  # would fail the pass if it were asked
    clock.now += 1.0
    relay.run_once()
    assert "reclaim_strays" in store.fail_next


# ----------------------------------------------------------------------- /metrics


class DownStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def counts(self) -> StateCounts:
        if self.down:
            raise DatabaseUnavailable("database x is not reachable: connection refused")
        return super().counts()

    def relays(self, within_seconds: float) -> list[tuple[str, dt.datetime, dt.datetime]]:
        if self.down:
            raise DatabaseUnavailable("database x is not reachable: connection refused")
        return super().relays(within_seconds)


@pytest.fixture
def registry() -> Iterator[tuple[CollectorRegistry, MeterProvider]]:
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    yield registry, provider
    provider.shutdown()


def test_metrics_while_the_database_is_down_say_so_once_and_answer_what_is_known(
    registry: tuple[CollectorRegistry, MeterProvider], caplog: pytest.LogCaptureFixture
) -> None:
    reg, provider = registry
    store = DownStore()
    observer = Observer(None, provider.get_meter("t"))
    observer.watch(store, lambda: {})
    observer.watch_window(lambda: 7)
    caplog.set_level(logging.INFO)
    for _ in range(3):
        text = generate_latest(reg).decode()
        assert "outbox_relay_window" in text  # what it knows without the database
        assert "outbox_messages{" not in text
    down = [r for r in caplog.records if r.getMessage() == "metrics.database_unavailable"]
    assert len(down) == 1
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    store.down = False
    generate_latest(reg)
    generate_latest(reg)
    back = [r for r in caplog.records if r.getMessage() == "metrics.database_available"]
    assert len(back) == 1
    assert "outbox_messages{" in generate_latest(reg).decode()


# ----------------------------------------------------------------------- database.connected


def _conn(host: str, port: int) -> SimpleNamespace:
    return SimpleNamespace(info=SimpleNamespace(host=host, port=port))


def test_the_loop_engine_names_the_server_when_it_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    where = f"postgresql+psycopg://u@/db-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG, logger="relay.store")
    said: Sequence[logging.LogRecord]
    for conn in (_conn("10.0.0.1", 5432), _conn("10.0.0.1", 5432), _conn("10.0.0.2", 5432)):
        engines._say_server(where, conn)
    said = [r for r in caplog.records if r.getMessage() == "database.connected"]
    assert [(r.host, r.levelno) for r in said] == [  # type: ignore[attr-defined]
        ("10.0.0.1:5432", logging.DEBUG),  # a start that fails next says so alone
        ("10.0.0.2:5432", logging.WARNING),
    ]
    assert said[1].previous == "10.0.0.1:5432"  # type: ignore[attr-defined]
    assert engines.server_of(object()) is None  # a driver that does not say (SQLite)
