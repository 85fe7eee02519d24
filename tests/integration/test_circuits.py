"""Circuit breakers and rate limits against the real PostgreSQL and RabbitMQ.

One exchange is broken for a while (deleted, then recreated) beside a healthy one: every healthy
message arrives while the other is broken, none charged a failure; the broken one's circuit
opens, its messages are held back, passed by and burn no attempts while it is open, none is
dead-lettered because of the outage, and all arrive after it recovers. Two relays share the
circuit and only one probes at a time. (How fast the healthy one goes beside the broken one is
the benchmark's `neighbour` phase: a pace, measured on an idle machine, not a test.)
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

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


def states(engine: Engine, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state, count(*) FROM outbox_message WHERE id = ANY(:ids) GROUP BY state"),
            {"ids": [str(i) for i in ids]},
        )
        return {str(state): int(n) for state, n in rows}


@pytest.mark.xdist_group("heavy")  # a full-speed drain: not beside another one
def test_a_broken_exchange_holds_its_own_messages_while_the_healthy_one_delivers_all(
    pg_engine: Engine,
    pg_url: str,
    broker: Broker,
    relay_factory: RelayFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    healthy = broker.exchange
    broken = broker.declare_exchange()
    broker.bind(broker.queue, broken)
    relay = relay_factory(pg_url, circuit=FAST)
    n_healthy, n_broken = 3000, 600

    # The outage: the broken exchange's messages are interleaved with the healthy ones.
    broker.delete_exchange(broken)
    plan = []
    for i in range(n_healthy):
        plan.append((healthy, f"ok-{i}"))
        if i % 5 == 0:
            plan.append((broken, f"broken-{i}"))
    ids = enqueue(pg_engine, plan)
    healthy_ids = [i for i, (ex, _) in zip(ids, plan, strict=True) if ex == healthy]
    broken_ids = [i for i, (ex, _) in zip(ids, plan, strict=True) if ex == broken]
    assert len(broken_ids) == n_broken

    # Every healthy message arrives while its neighbour is still missing, and none of them was
    # charged a failure: the broken exchange's messages failed on a channel of their own.
    broker.collect_ids(healthy_ids, timeout=60)
    assert {str(i) for i in healthy_ids} <= {d.message_id for d in broker.received}
    assert attempt_outcomes(pg_engine, healthy_ids) == {}
    wait_until(  # a message may reach the queue a moment before its row is marked
        lambda: states(pg_engine, healthy_ids) == {"published": n_healthy}, what="healthy marked"
    )
    wait_until(lambda: circuit_of(relay, broken) is not CircuitState.CLOSED, what="open circuit")
    # Only the failures up to the threshold counted against their messages (before the circuit
    # knew the exchange was broken); every later one, and every failed probe, was free. Without
    # a circuit each of the 600 would have been charged a failure by now, and kept failing until
    # dead; with it they wait, none lost, while the healthy ones went past them.
    outcomes = attempt_outcomes(pg_engine, broken_ids)
    assert outcomes.get("retry", 0) <= FAST.threshold, outcomes
    assert outcomes.get("dead", 0) == 0, outcomes
    held = states(pg_engine, broken_ids)
    assert held.get("published", 0) == held.get("dead", 0) == 0, held
    assert sum(held.values()) == n_broken, held
    # The probes keep failing while it is down; the circuit reopens, nothing dies. And the open
    # circuit passes the 600 by: the only messages still sent to the broken exchange are the
    # probes, each one free attempt (plus one probe begun before `since`). A relay that claimed
    # them anyway would send each one again at every cooldown's end: hundreds of free attempts.
    since = time.time()
    time.sleep(2 * FAST.max_cooldown)
    assert circuit_of(relay, broken) is not CircuitState.CLOSED
    outcomes = attempt_outcomes(pg_engine, broken_ids)
    assert outcomes.get("retry", 0) <= FAST.threshold, outcomes
    assert outcomes.get("dead", 0) == 0, outcomes
    assert outcomes.get("deferred", 0) >= 1, outcomes  # probes happened, and burned nothing
    probes = [
        r for r in caplog.records if r.getMessage() == "circuit.half_open" and r.created >= since
    ]
    with pg_engine.connect() as conn:
        free_since = conn.execute(
            text(
                "SELECT count(*) FROM outbox_attempt WHERE message_id = ANY(:ids) "
                "AND outcome = 'deferred' AND at >= to_timestamp(:t)"
            ),
            {"ids": [str(i) for i in broken_ids], "t": since},
        ).scalar_one()
    assert free_since <= len(probes) + 1, (free_since, len(probes))

    # Recovery: recreate the exchange; the next probe closes the circuit and everything flows.
    broker.declare_exchange(broken)
    broker.bind(broker.queue, broken)
    broker.collect_ids(broken_ids, timeout=60)
    wait_until(lambda: circuit_of(relay, broken) is CircuitState.CLOSED, what="closed circuit")
    with pg_engine.connect() as conn:
        dead = conn.execute(text("SELECT count(*) FROM outbox_message WHERE state = 'dead'"))
        assert dead.scalar_one() == 0
    wait_until(
        lambda: states(pg_engine, ids) == {"published": n_healthy + n_broken}, what="all marked"
    )
    delivered = {d.message_id for d in broker.received}
    assert {str(i) for i in ids} <= delivered


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
