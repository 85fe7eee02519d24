"""outbox.Consumer(partitions=N) on a partitioned queue (a topology file's `partitions = N`): every
partition consumed, a key's messages processed in order, and the order the documentation states
under retries: a message its handler retried comes back after its key's later messages, in its own
partition; one that is dead-lettered is skipped. Each test in a vhost of its own."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from relay.amqp import topology
from relay.core.topology import read_topology
from tests.support.vhosts import module_vhost_url, rabbitmqctl
from tests.support.waiting import wait_until

__all__ = ["module_vhost_url"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FILE = """
[[exchanges]]
name = "orders"
type = "topic"

[[queues]]
name = "work"
bindings = [{ exchange = "orders", routing_key = "order.*" }]
partitions = 2
"""
KEYS = ["a", "b", "c", "d", "e", "f"]


def _publish(amqp_url: str, exchange: str, per_key: int) -> dict[str, list[str]]:
    """`per_key` messages for each key, interleaved, in order; the ids per key."""
    ids: dict[str, list[str]] = {k: [] for k in KEYS}
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for n in range(per_key):
            for key in KEYS:
                message_id = str(uuid.uuid4())
                ids[key].append(message_id)
                props = pika.BasicProperties(
                    message_id=message_id, headers={"x-outbox-key": key}, delivery_mode=2
                )
                body = f'{{"n": {n}}}'.encode()
                channel.basic_publish(exchange, "order.created", body, props, mandatory=True)
    finally:
        conn.close()
    return ids


@pytest.fixture
def consuming(
    pg_engine: Engine, module_vhost_url: str, request: pytest.FixtureRequest
) -> Iterator[tuple[list[tuple[str, str]], Any]]:
    """A partitioned consumer recording (key, id) as it processes; `fail` maps ids to the
    exception their first attempt raises. Names of the test's own ("orders-<test>",
    "work-<test>"): the module's tests share a vhost."""
    vhost_url = module_vhost_url
    tag = request.node.name.split("_")[1]
    text = FILE.replace('"orders"', f'"orders-{tag}"').replace('"work"', f'"work-{tag}"')
    if tag == "quorum":
        text = text.replace('name = "work-quorum"', 'name = "work-quorum"\ntype = "quorum"')
    topology.apply(vhost_url, read_topology(text))
    processed: list[tuple[str, str]] = []
    fail: dict[str, Exception] = {}

    def handle(_session: Session, message: outbox.Message) -> None:
        if message.attempt == 1 and message.id in fail:
            raise fail[message.id]
        processed.append((str(message.headers["x-outbox-key"]), message.id))

    consumer = outbox.Consumer(
        pg_engine, vhost_url, f"work-{tag}", handle, partitions=2, prefetch=1, inbox_retention=None,
        policy=outbox.ConsumerPolicy(backoff_base=1.0, max_attempts=3),
    )  # fmt: skip
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    consumer.ready.wait(10)
    try:
        yield processed, (fail, consumer, f"orders-{tag}")
    finally:
        consumer.stop()
        thread.join(15)


def _by_key(processed: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, message_id in processed:
        out.setdefault(key, []).append(message_id)
    return out


def test_every_partition_is_consumed_and_each_key_in_order(
    consuming: tuple[list[tuple[str, str]], Any], module_vhost_url: str
) -> None:
    processed, (_, consumer, exchange) = consuming
    ids = _publish(module_vhost_url, exchange, 5)
    wait_until(lambda: len(processed) == 30, what="30 processed")
    assert _by_key(processed) == ids
    assert consumer.queues == ["work-every.0", "work-every.1"]
    # Both partitions had work: the keys spread over them.
    assert all(p.counts.get("processed", 0) > 0 for p in consumer.processors)


def test_a_retried_message_comes_back_after_its_keys_later_ones_and_a_dead_one_is_skipped(
    consuming: tuple[list[tuple[str, str]], Any], module_vhost_url: str
) -> None:
    processed, (fail, consumer, exchange) = consuming
    # The ids are known only once published: fail the second of key a on its first attempt,
    # and dead-letter the second of key b. Published after the failures are registered.
    planned = {k: [str(uuid.uuid4()) for _ in range(4)] for k in KEYS}
    fail[planned["a"][1]] = outbox.Retry("not yet", delay=1)
    fail[planned["b"][1]] = outbox.Reject("never")
    conn = pika.BlockingConnection(pika.URLParameters(module_vhost_url))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for n in range(4):
            for key in KEYS:
                props = pika.BasicProperties(
                    message_id=planned[key][n], headers={"x-outbox-key": key}, delivery_mode=2
                )
                channel.basic_publish(exchange, "order.created", b"{}", props, mandatory=True)
    finally:
        conn.close()
    wait_until(lambda: len(processed) == 23, what="23 processed (one dead)")
    by_key = _by_key(processed)
    a = planned["a"]
    assert by_key["a"] == [a[0], a[2], a[3], a[1]]  # the retried one last, after its delay
    assert by_key["b"] == [planned["b"][i] for i in (0, 2, 3)]  # the dead one skipped
    for key in KEYS[2:]:
        assert by_key[key] == planned[key]

    def totals() -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in consumer.processors:
            for outcome, n in p.counts.items():
                counts[outcome] = counts.get(outcome, 0) + n
        return counts

    # A processor counts a message once its handler's transaction has committed: the count may
    # trail the handler's own record of it.
    want = {"processed": 23, "retried": 1, "dead": 1}
    wait_until(lambda: totals() == want, what=f"the processors' counts to be {want}")


def test_quorum_partitions_keep_each_key_in_order(
    consuming: tuple[list[tuple[str, str]], Any], module_vhost_url: str
) -> None:
    processed, (_, _consumer, exchange) = consuming
    vhost = module_vhost_url.rsplit("/", 1)[1]
    listed = rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name", "type")
    types = dict(line.split() for line in listed.splitlines() if line.startswith("work-quorum"))
    assert types == {"work-quorum.0": "quorum", "work-quorum.1": "quorum"}
    ids = _publish(module_vhost_url, exchange, 5)
    wait_until(lambda: len(processed) == 30, what="30 processed")
    assert _by_key(processed) == ids
