"""Hot keys against the real broker, on every database: a few keys carrying most of the traffic
drain in runs (published one after another, each once the one before it is confirmed), and
their order holds while the broker rejects messages in the middle of runs and two relays share
the work."""

from __future__ import annotations

import uuid
from collections import defaultdict

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from tests.integration.test_ordering import FAST_RETRIES, Arrivals
from tests.support.broker import Broker
from tests.support.db import states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


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
    arrivals = Arrivals(broker, queue)
    # A slow consumer: the queue stays near full, so nacks go on.
    wait_until(
        lambda: arrivals.drain(at_most=20) >= total,
        timeout=150,
        interval=0.005,
        what=f"{total} distinct messages",
    )
    wait_until(lambda: states(app_engine) == {"published": total}, timeout=30, what="published")
    arrivals.check(ids, sent)
    assert sum(r.summary.retried for r in relays) > 0, "the scenario must include rejections"
