"""The floor relays the bench measures the relay against (benchmarks/floor.py) do the relay's
work for real: every ready row published once, with its id, then marked published; on hot keys,
each key's messages in order."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

import outbox
from benchmarks.floor import drain_floor, drain_floor_keys
from relay.loop.chains import NEXT_RUN
from tests.support.broker import Broker

pytestmark = pytest.mark.integration


def test_the_floor_relay_publishes_every_ready_row_once_and_marks_it(
    pg_url: str, pg_engine: Engine, broker: Broker, amqp_url: str
) -> None:
    with pg_engine.begin() as conn:
        ids = [
            outbox.enqueue(
                conn,
                exchange=broker.exchange,
                routing_key="floor",
                payload={"n": n},
                headers={"n": str(n)},
            )
            for n in range(1_200)
        ]
    # A window smaller than a claim: the claims and marks turn over many times.
    found = drain_floor(pg_url, amqp_url, len(ids), claim=500, window=300, timeout=60)
    assert found.messages == len(ids)
    received = broker.collect_ids(ids, timeout=30)
    assert sorted(str(d.message_id) for d in received) == sorted(str(i) for i in ids)
    assert {d.properties.headers["n"] for d in received} == {str(n) for n in range(1_200)}
    assert _states(pg_engine) == {"published": len(ids)}


def test_the_keyed_floor_relay_publishes_each_key_in_order_across_its_runs(
    pg_url: str, pg_engine: Engine, broker: Broker, amqp_url: str
) -> None:
    keys = ("a", "b", "c")
    per_key = 2 * NEXT_RUN + 17  # three runs each, the last one short
    with pg_engine.begin() as conn:
        ids = [
            outbox.enqueue(
                conn,
                exchange=broker.exchange,
                routing_key="floor",
                payload={"n": n},
                key=keys[n % len(keys)],
                headers={"n": str(n)},
            )
            for n in range(per_key * len(keys))
        ]
    found = drain_floor_keys(pg_url, amqp_url, len(ids), timeout=60)
    assert found.messages == len(ids)
    received = broker.collect_ids(ids, timeout=30)
    assert sorted(str(d.message_id) for d in received) == sorted(str(i) for i in ids)
    for k, key in enumerate(keys):
        got = [n for d in received if (n := int(d.properties.headers["n"])) % len(keys) == k]
        assert got == list(range(k, per_key * len(keys), len(keys))), key
    assert _states(pg_engine) == {"published": len(ids)}


def _states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT state, count(*) FROM outbox_message GROUP BY 1"))
        return {state: count for state, count in found}
