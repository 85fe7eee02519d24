"""A real three-node RabbitMQ cluster (tests/faults/rabbit_cluster.py), a quorum queue, and the
node the relay is connected to, which leads the queue, SIGKILLed mid-drain: the relay moves to
another node, the queue elects a new leader meanwhile (and nacks), and still nothing is lost,
no attempt is burned and no circuit opens (relay/amqp/nacks.py).

The cluster is brought up once for the module (reused if it is up already, and then left up)
and torn down at its end; the machine's broker on 5672 is not used.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from sqlalchemy import Engine, func, select

import outbox
from outbox.schema import attempt
from relay.amqp.publisher import Publisher
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.store.sql_store import open_store
from tests.faults import rabbit_cluster as cluster
from tests.support.db import row_count
from tests.support.relays import RELAY_TEST_CONFIG
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.integration,
    # The first test's time includes the module's cluster start (three nodes), which takes a
    # minute or more on a loaded machine: each of its waits is bounded on its own.
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("rabbit-cluster"),
]
ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 6000


@pytest.fixture(scope="module")
def nodes() -> Iterator[None]:
    was_up = all(n.pid() is not None for n in cluster.ALL)
    cluster.up()
    yield
    if not was_up:
        cluster.down()


def apply_topology(tmp_path: Path, exchange: str, queue: str) -> None:
    """The exchange and a quorum queue, declared as a user does: `outbox-relay topology apply`."""
    spec = tmp_path / "topology.toml"
    spec.write_text(
        f'[[exchanges]]\nname = "{exchange}"\ntype = "topic"\n\n'
        f'[[queues]]\nname = "{queue}"\ntype = "quorum"\n'
        f'bindings = [{{ exchange = "{exchange}", routing_key = "#" }}]\n'
    )
    subprocess.run(
        [sys.executable, "-m", "relay", "--amqp", cluster.urls(), "topology", "apply", str(spec)],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def received(node: cluster.Node, queue: str) -> list[str]:
    """Every message id in `queue`, read from `node` (a node the test does not kill): consumed
    until nothing more comes for 5 s. A consumer, not basic.get: from a follower each get is a
    round trip to the leader, and thousands of them outlast the test on a loaded machine."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        channel = conn.channel()
        ids: list[str] = []
        for method, props, _body in channel.consume(queue, auto_ack=True, inactivity_timeout=5):
            if method is None:
                break
            ids.append(str(props.message_id))
        channel.cancel()
        return ids
    finally:
        conn.close()


def start_relay(db_url: str, amqp_urls: str) -> tuple[Relay, threading.Thread]:
    config = RelayConfig(
        db_url=db_url, amqp_url=amqp_urls, relay_id=f"cluster-{uuid.uuid4().hex[:8]}",
        **RELAY_TEST_CONFIG,
    )  # fmt: skip
    store = open_store(db_url)
    publisher = Publisher(amqp_urls, confirm_timeout=config.confirm_timeout, name=config.relay_id)
    publisher.start()
    relay = wire_relay(store, publisher, config)
    thread = threading.Thread(target=relay.run, name=config.relay_id, daemon=True)
    thread.start()
    return relay, thread


@pytest.mark.usefixtures("nodes")
def test_killing_the_leaders_node_mid_drain_loses_nothing_and_burns_no_attempt(
    pg_engine: Engine, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    suffix = uuid.uuid4().hex[:8]
    exchange, queue = f"cluster.{suffix}", f"cluster.{suffix}.q"
    apply_topology(tmp_path, exchange, queue)
    leader = cluster.leader(queue)
    assert leader is not None, "the quorum queue has no leader"
    with pg_engine.begin() as conn:
        ids = [
            str(outbox.enqueue(conn, exchange=exchange, routing_key="r", payload={"n": n},
                               key=f"k{n % 200}" if n % 2 else None))
            for n in range(MESSAGES)
        ]  # fmt: skip

    # The relay on the leader's node first, as the relay that declared the queue would be.
    relay, thread = start_relay(pg_url, cluster.urls(first=leader.n))
    killed = False
    try:
        wait_until(lambda: row_count(pg_engine, state="published") >= MESSAGES // 10,
                   timeout=30, interval=0.01, what="a tenth published")  # fmt: skip
        cluster.kill(leader)
        killed = True
        wait_until(lambda: row_count(pg_engine, state="published") == MESSAGES, timeout=45,
                   what="every row published")  # fmt: skip
    finally:
        relay.request_stop()
        thread.join(30)
        relay.store.close()
        if killed:
            cluster.revive(leader)  # the cluster whole again for whoever reuses it
    publisher = relay.publisher
    assert isinstance(publisher, Publisher)
    assert publisher.connections == 2, "the relay did not move to another node"

    other = next(n for n in cluster.ALL if n != leader)
    got = received(other, queue)
    assert set(ids) - set(got) == set(), "messages lost"
    assert set(got) <= set(ids)
    with pg_engine.connect() as conn:
        burned = conn.execute(
            select(func.count()).where(attempt.c.outcome.in_(["retry", "dead"]))
        ).scalar_one()
    assert burned == 0, "an attempt was burned on the election's nacks"
    assert not [r for r in caplog.records if r.msg == "circuit.opened"]
    assert row_count(pg_engine, state="dead") == 0
