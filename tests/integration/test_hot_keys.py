"""Hot keys against the real broker, on every database: a few keys carrying most of the traffic
drain in runs (published one after another, each once the one before it is confirmed), and
their order holds while the broker rejects messages in the middle of runs and two relays share
the work."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from relay.core.policy import RetryPolicy
from tests.conftest import Broker, RelayFactory, states, wait_until

pytestmark = pytest.mark.integration

FAST_RETRIES = RetryPolicy(base=0.05, cap=0.3, floor=0.01, max_attempts=1000)


@pytest.mark.xdist_group("heavy")
def test_hot_keys_keep_their_order_through_rejections_in_mid_run(
    db_url: str, app_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    # A queue that holds 40 messages and nacks the rest until the test drains it: rejections
    # land anywhere in a run, and the rest of that run must wait behind the rejected one.
    exchange = broker.declare_exchange()
    queue = broker.declare_queue(
        bind_to=exchange, arguments={"x-max-length": 40, "x-overflow": "reject-publish"}
    )
    hot = {"h0": 300, "h1": 150, "h2": 50}
    sent: dict[str, list[int]] = defaultdict(list)
    ids: list[uuid.UUID] = []
    with Session(app_engine) as session, session.begin():
        for n in range(max(hot.values())):
            for key, count in hot.items():
                if n < count:
                    payload = {"key": key, "n": n}
                    ids.append(
                        outbox.enqueue(
                            session, exchange=exchange, routing_key="o", payload=payload, key=key
                        )
                    )
                    sent[key].append(n)
            if n % 5 == 0:  # a little traffic beside them, unkeyed and on cold keys
                ids.append(outbox.enqueue(session, exchange=exchange, routing_key="o", payload={}))
                cold = f"c{n}"
                payload = {"key": cold, "n": 0}
                ids.append(
                    outbox.enqueue(
                        session, exchange=exchange, routing_key="o", payload=payload, key=cold
                    )
                )
                sent[cold].append(0)
    relays = [relay_factory(db_url, policy=FAST_RETRIES) for _ in range(2)]
    total = len(ids)
    order: dict[str, list[int]] = defaultdict(list)
    seen: set[str] = set()

    def drain() -> bool:
        channel = broker._channel  # the fixture's own channel, on the test thread
        for _ in range(20):  # a slow consumer: the queue stays near full, so nacks go on
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            seen.add(props.message_id)
            payload = json.loads(body)
            if "key" in payload:
                assert props.headers["x-outbox-key"] == payload["key"]
                order[payload["key"]].append(payload["n"])
        return len(seen) >= total

    wait_until(drain, timeout=150, interval=0.005, what=f"{total} distinct messages")
    wait_until(lambda: states(app_engine) == {"published": total}, timeout=30, what="published")

    assert seen == {str(i) for i in ids}
    for key, arrived in order.items():
        # At-least-once allows a repeat, never a step back.
        assert arrived == sorted(arrived), f"{key} arrived out of order: {arrived}"
        assert sorted(set(arrived)) == sent[key]
    assert sum(r.summary.retried for r in relays) > 0, "the scenario must include rejections"
