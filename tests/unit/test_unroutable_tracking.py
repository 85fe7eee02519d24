"""The relay's memory of unroutable destinations (relay/loop/settler.py): one log line per exchange
and routing key while it stays unroutable, forgotten once a message to it is confirmed, so a
destination that breaks again is logged (and given its grace) afresh."""

from __future__ import annotations

import datetime as dt
import logging
import random

import pytest

from relay.core.outcome import Fate, Outcome
from relay.loop.wiring import wire_relay
from relay.ports import Outgoing
from relay.runtime.config import RelayConfig
from tests.unit.fakes import EPOCH, FakePublisher, FakeStore, make_claimed


def test_each_unroutable_destination_is_logged_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="relay")
    routable: set[tuple[str, str]] = set()

    def decide(item: Outgoing) -> Outcome:
        if (item.exchange, item.routing_key) in routable:
            return Outcome(item.seq, Fate.CONFIRMED)
        return Outcome(item.seq, Fate.UNROUTABLE, "312 NO_ROUTE")

    store = FakeStore()
    store.add(make_claimed(1), make_claimed(2), make_claimed(3, routing_key="other"))
    wall = [EPOCH]
    relay = wire_relay(
        store, FakePublisher(decide=decide), RelayConfig(db_url="sqlite://", relay_id="t"),
        clock=lambda: (wall[0] - EPOCH).total_seconds(), wall=lambda: wall[0], rng=random.Random(1),
    )  # fmt: skip

    def turn(minutes: float) -> None:
        wall[0] = store.now = EPOCH + dt.timedelta(minutes=minutes)  # everything deferred is due
        relay.run_once()
        relay.run_once()

    def logged() -> list[str]:
        return sorted(
            str(getattr(r, "routing_key", ""))
            for r in caplog.records
            if r.getMessage() == "relay.unroutable_waiting"
        )

    turn(0)
    turn(1)
    assert store.states() == {1: "pending", 2: "pending", 3: "pending"}
    assert all(row.burned == 0 for row in store.rows.values())  # deferred: nothing charged
    assert logged() == ["other", "rk"]  # once each, though tried twice
    assert not [r for r in caplog.records if r.getMessage() == "relay.deferred"]

    routable.add(("ex", "rk"))
    turn(2)
    assert store.states() == {1: "published", 2: "published", 3: "pending"}
    routable.clear()
    store.add(make_claimed(4))
    turn(3)
    assert store.states()[4] == "pending"
    assert logged() == ["other", "rk", "rk"]  # rk routed, then broke again: logged afresh
