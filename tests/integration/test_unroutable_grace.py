"""A relay started before its consumers' queues exist dead-letters nothing: unroutable messages
are deferred (no attempt charged, one log line per exchange and routing key) through the grace,
and published once a queue is bound; past the grace they are dead, with the reason.

The grace here is short so the tests take seconds; with OUTBOX_SLOW_TESTS=1 the last test runs
the relay as operators do (`outbox-relay run`, the default grace) and binds the queue 30 s after
the relay starts."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import Engine, func, select

import outbox
from outbox.schema import attempt, message
from relay.core.policy import RetryPolicy
from tests.support.broker import AMQP_URL, Broker
from tests.support.cli import environment
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _enqueue(engine: Engine, exchange: str, routing_keys: list[str]) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange=exchange, routing_key=rk, payload={"n": n})
            for n, rk in enumerate(routing_keys)
        ]


def _states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(select(message.c.state, func.count()).group_by(message.c.state))
        return {str(state): int(n) for state, n in rows}


def _deferred(engine: Engine) -> int:
    with engine.connect() as conn:
        query = select(func.count()).where(
            attempt.c.failure_class == "unroutable", attempt.c.outcome == "deferred"
        )
        return int(conn.execute(query).scalar_one())


def test_messages_wait_for_a_queue_bound_after_the_relay_started(
    pg_engine: Engine, pg_url: str, broker: Broker, relay_factory: RelayFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="relay")
    late = broker.declare_exchange()  # exists; its consumers' queue does not yet
    ids = _enqueue(pg_engine, late, ["order.created"] * 20 + ["order.paid"] * 10)
    relay_factory(pg_url, policy=RetryPolicy(unroutable_grace=20.0, max_attempts=1))
    wait_until(lambda: _deferred(pg_engine) >= 30, what="every message deferred once")

    broker.bind(broker.queue, late)  # the consumer starts, a moment late
    received = broker.collect_ids(ids, timeout=20)
    assert {d.message_id for d in received} == {str(i) for i in ids}
    wait_until(lambda: _states(pg_engine) == {"published": 30}, what="30 published, 0 dead")
    # Deferred: no attempt charged, though one attempt is all the policy allows.
    waiting = [r for r in caplog.records if r.getMessage() == "relay.unroutable_waiting"]
    assert sorted(str(getattr(r, "routing_key", "")) for r in waiting) == [
        "order.created",
        "order.paid",
    ]
    assert not [r for r in caplog.records if r.getMessage() == "relay.deferred"]


def test_past_the_grace_an_unroutable_message_is_dead_with_its_reason(
    pg_engine: Engine, pg_url: str, broker: Broker, relay_factory: RelayFactory
) -> None:
    nowhere = broker.declare_exchange()
    _enqueue(pg_engine, nowhere, ["r"])
    relay_factory(pg_url, policy=RetryPolicy(unroutable_grace=1.0))
    wait_until(lambda: _states(pg_engine) == {"dead": 1}, what="the message dead")
    with pg_engine.connect() as conn:
        reason = conn.execute(select(message.c.last_error)).scalar_one()
    assert "unroutable (permanent): " in reason
    assert "NO_ROUTE" in reason
    assert "past the 1 s grace" in reason
    assert _deferred(pg_engine) >= 1


@pytest.mark.skipif(not os.environ.get("OUTBOX_SLOW_TESTS"), reason="OUTBOX_SLOW_TESTS=1: 40 s")
@pytest.mark.timeout(120)
def test_a_queue_declared_30_s_after_the_relay_starts_loses_nothing(
    pg_engine: Engine, pg_url: str, broker: Broker
) -> None:
    late = broker.declare_exchange()
    ids = _enqueue(pg_engine, late, ["order.created"] * 50)
    env = environment(OUTBOX_DB_URL=pg_url, OUTBOX_AMQP_URL=AMQP_URL)
    relay = subprocess.Popen(
        [sys.executable, "-m", "relay", "run"], env=env, stderr=subprocess.PIPE, text=True
    )
    started = time.monotonic()
    try:
        wait_until(lambda: _deferred(pg_engine) >= 50, what="every message deferred once")
        # The scenario itself, not a synchronisation: the consumer comes up 30 s later.
        wait_until(lambda: time.monotonic() - started >= 30, timeout=40, interval=0.5)
        assert _states(pg_engine) == {"pending": 50}
        broker.bind(broker.queue, late)
        received = broker.collect_ids(ids, timeout=40)
        assert len({d.message_id for d in received}) == 50
        wait_until(lambda: _states(pg_engine) == {"published": 50}, timeout=20)
    finally:
        relay.send_signal(signal.SIGTERM)
        _, log = relay.communicate(timeout=30)
    assert relay.returncode == 0, log
    assert log.count("relay.unroutable_waiting") == 1, log
