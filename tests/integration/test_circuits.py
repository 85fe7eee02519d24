"""Circuit breakers and rate limits against the real PostgreSQL and RabbitMQ.

One exchange is broken for a while (deleted, then recreated) beside a healthy one: the healthy
one keeps its pace, the broken one's circuit opens, its messages burn no attempts while it is
open, none is dead-lettered because of the outage, and all arrive after it recovers. Two relays
share the circuit and only one probes at a time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence

import pytest
from sqlalchemy import Engine, text

import outbox
from relay.core.circuit import CircuitSettings, CircuitState
from relay.loop.relay import Relay
from tests.support.broker import Broker
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

FAST = CircuitSettings(threshold=5, cooldown=0.5, max_cooldown=2.0, probe_timeout=30.0)


def enqueue(engine: Engine, plan: Sequence[tuple[str, str]]) -> list[uuid.UUID]:
    """Enqueue (exchange, payload) pairs in one transaction; return the ids in order."""
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange=ex, routing_key="r", payload=payload)
            for ex, payload in plan
        ]


def circuit_of(relay: Relay, exchange: str) -> CircuitState:
    for row in relay.store.resources():
        if row.circuit.resource == relay.guard.naming.name(exchange):
            return row.circuit.state
    return CircuitState.CLOSED


def attempt_outcomes(engine: Engine, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT outcome, count(*) FROM outbox_attempt "
                "WHERE message_id = ANY(:ids) GROUP BY outcome"
            ),
            {"ids": [str(i) for i in ids]},
        )
        return {str(outcome): int(n) for outcome, n in rows}


def deliver_and_time(broker: Broker, ids: list[uuid.UUID], started: float) -> float:
    broker.collect_ids(ids, timeout=60)
    return time.monotonic() - started


@pytest.mark.xdist_group("heavy")  # compares two drain paces: not beside another drain
def test_a_broken_exchange_leaves_the_healthy_one_at_full_pace_and_loses_nothing(
    pg_engine: Engine,
    pg_url: str,
    broker: Broker,
    relay_factory: RelayFactory,
    record_property: Callable[[str, object], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    healthy = broker.exchange
    broken = broker.declare_exchange()
    broker.bind(broker.queue, broken)
    relay = relay_factory(pg_url, circuit=FAST)
    n_healthy, n_broken = 3000, 600

    # Baseline: nothing broken.
    started = time.monotonic()
    baseline_ids = enqueue(pg_engine, [(healthy, f"base-{i}") for i in range(n_healthy)])
    baseline = deliver_and_time(broker, baseline_ids, started)

    # The outage: the broken exchange's messages are interleaved with the healthy ones.
    broker.delete_exchange(broken)
    plan = []
    for i in range(n_healthy):
        plan.append((healthy, f"ok-{i}"))
        if i % 5 == 0:
            plan.append((broken, f"broken-{i}"))
    started = time.monotonic()
    ids = enqueue(pg_engine, plan)
    healthy_ids = [i for i, (ex, _) in zip(ids, plan, strict=True) if ex == healthy]
    broken_ids = [i for i, (ex, _) in zip(ids, plan, strict=True) if ex == broken]
    assert len(broken_ids) == n_broken
    during = deliver_and_time(broker, healthy_ids, started)

    wait_until(lambda: circuit_of(relay, broken) is not CircuitState.CLOSED, what="open circuit")
    # Only the failures up to the threshold counted against their messages (before the circuit
    # knew the exchange was broken); every later one, and every failed probe, was free.
    outcomes = attempt_outcomes(pg_engine, broken_ids)
    assert outcomes.get("retry", 0) <= FAST.threshold, outcomes
    assert outcomes.get("dead", 0) == 0, outcomes
    # The probes keep failing while it is down; the circuit reopens, nothing dies.
    time.sleep(2 * FAST.max_cooldown)
    assert circuit_of(relay, broken) is not CircuitState.CLOSED
    outcomes = attempt_outcomes(pg_engine, broken_ids)
    assert outcomes.get("retry", 0) <= FAST.threshold, outcomes
    assert outcomes.get("deferred", 0) >= 1, outcomes  # probes happened, and burned nothing

    # Recovery: recreate the exchange; the next probe closes the circuit and everything flows.
    broker.declare_exchange(broken)
    broker.bind(broker.queue, broken)
    broker.collect_ids(broken_ids, timeout=60)
    wait_until(lambda: circuit_of(relay, broken) is CircuitState.CLOSED, what="closed circuit")
    with pg_engine.connect() as conn:
        dead = conn.execute(text("SELECT count(*) FROM outbox_message WHERE state = 'dead'"))
        assert dead.scalar_one() == 0
    delivered = {d.message_id for d in broker.received}
    assert {str(i) for i in ids + baseline_ids} <= delivered

    ratio = (n_healthy / during) / (n_healthy / baseline)
    record_property("healthy_rate_ratio_during_outage", round(ratio, 3))
    with capsys.disabled():
        print(
            f"\n[circuits] healthy exchange: {n_healthy / baseline:,.0f} msg/s alone, "
            f"{n_healthy / during:,.0f} msg/s beside a broken one ({ratio:.2f}x)"
        )
    # A ratio, not a time: a broken neighbour must not cost the healthy flow a large factor.
    assert ratio > 0.3


def test_two_relays_see_the_same_circuit_and_only_one_probes_at_a_time(
    pg_engine: Engine,
    pg_url: str,
    broker: Broker,
    relay_factory: RelayFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    broken = broker.declare_exchange()
    broker.bind(broker.queue, broken)
    broker.delete_exchange(broken)
    settings = CircuitSettings(threshold=3, cooldown=0.3, max_cooldown=0.6, probe_timeout=30.0)
    first = relay_factory(pg_url, circuit=settings, circuit_refresh=0.1)
    second = relay_factory(pg_url, circuit=settings, circuit_refresh=0.1)
    ids = enqueue(pg_engine, [(broken, f"m-{i}") for i in range(40)])

    wait_until(lambda: circuit_of(first, broken) is not CircuitState.CLOSED, what="open circuit")
    # Both relays pass the resource by, whichever of them saw the failures.
    part = first.guard.naming.part(broken, "r")
    wait_until(
        lambda: first.guard.circuit(part).blocks and second.guard.circuit(part).blocks,
        what="both relays seeing the open circuit",
    )
    time.sleep(4.0)  # several cooldowns: a probe in each, each failing

    def events(name: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == name]

    probes, reopened = events("circuit.half_open"), events("circuit.reopened")
    assert len(probes) >= 3
    # Probes and reopenings alternate: a second probe is only taken after the first one's
    # outcome reopened the circuit (at most one probe can still be in flight now).
    assert len(probes) - len(reopened) in (0, 1)
    relays = (first.config.relay_id, second.config.relay_id)
    assert all(any(name in getattr(r, "reason", "") for name in relays) for r in probes)
    outcomes = attempt_outcomes(pg_engine, ids)
    assert outcomes.get("retry", 0) <= settings.threshold, outcomes
    assert outcomes.get("dead", 0) == 0
    # From the first probe on, each failed probe is one free attempt on one message: while the
    # circuit was open neither relay sent anything else.
    with pg_engine.connect() as conn:
        since_first_probe = conn.execute(
            text(
                "SELECT count(*) FROM outbox_attempt WHERE message_id = ANY(:ids) "
                "AND outcome = 'deferred' AND at >= to_timestamp(:t)"
            ),
            {"ids": [str(i) for i in ids], "t": probes[0].created},
        ).scalar_one()
    assert len(reopened) <= since_first_probe <= len(reopened) + 1

    broker.declare_exchange(broken)
    broker.bind(broker.queue, broken)
    broker.collect_ids(ids, timeout=30)
    assert len(events("circuit.closed")) == 1


def test_a_rate_limit_is_shared_by_two_relays(
    pg_engine: Engine,
    pg_url: str,
    broker: Broker,
    relay_factory: RelayFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rate = 50.0
    limits = {broker.exchange: rate}
    relay_factory(pg_url, rate_limits=limits)
    relay_factory(pg_url, rate_limits=limits)
    n = 200
    started = time.monotonic()
    ids = enqueue(pg_engine, [(broker.exchange, f"m-{i}") for i in range(n)])
    broker.collect_ids(ids, timeout=30)
    got = [d.received_at for d in broker.received]
    elapsed = max(got) - started
    # A full bucket (one second's worth) goes at once; the rest at the rate, whoever sends it.
    expected = (n - rate) / rate
    with capsys.disabled():
        print(f"\n[rate limit] {n} messages at {rate:g}/s by two relays took {elapsed:.2f} s "
              f"(the limit allows no less than {expected:.2f} s)")  # fmt: skip
    assert elapsed >= expected * 0.9
