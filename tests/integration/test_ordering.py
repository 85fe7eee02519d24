"""Per-key order with several relays and real publish failures; keyless messages never wait."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from relay.core.policy import RetryPolicy
from tests.support.broker import Broker
from tests.support.cli import cli
from tests.support.db import states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

FAST_RETRIES = RetryPolicy(base=0.05, cap=0.3, floor=0.01, max_attempts=1000)


class Arrivals:
    """What a queue received, read on the broker fixture's own channel (the test's thread):
    every message id, and each key's payload numbers (`{"key": k, "n": n}`) in arrival order."""

    def __init__(self, broker: Broker, queue: str) -> None:
        self._channel = broker._channel
        self._queue = queue
        self.seen: set[str] = set()
        self.order: dict[str, list[int]] = defaultdict(list)

    def drain(self, at_most: int | None = None) -> int:
        """Take what is there (at most `at_most`); return how many distinct ids arrived."""
        taken = 0
        while at_most is None or taken < at_most:
            method, props, body = self._channel.basic_get(self._queue, auto_ack=True)
            if method is None:
                break
            taken += 1
            self.seen.add(props.message_id)
            payload = json.loads(body)
            if "key" in payload:
                assert props.headers["x-outbox-key"] == payload["key"]
                self.order[payload["key"]].append(payload["n"])
        return len(self.seen)

    def check(self, ids: list[uuid.UUID], sent: dict[str, list[int]]) -> None:
        """Every id arrived; every key's in order, all of them. At-least-once allows a repeat,
        never a step back: a later message of a key is only sent once every earlier one is
        published."""
        assert self.seen == {str(i) for i in ids}
        for key, arrived in self.order.items():
            assert arrived == sorted(arrived), f"{key} arrived out of order: {arrived}"
            assert sorted(set(arrived)) == sent[key]


@pytest.mark.xdist_group("heavy")
def test_three_relays_keep_per_key_order_while_publishes_fail_and_are_retried(
    pg_url: str, pg_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    # A queue that holds 100 messages and nacks the rest until the consumer drains it: real
    # broker rejections, retried with backoff, at random points in every key's sequence.
    exchange = broker.declare_exchange()
    queue = broker.declare_queue(
        bind_to=exchange, arguments={"x-max-length": 100, "x-overflow": "reject-publish"}
    )
    relays = [relay_factory(pg_url, policy=FAST_RETRIES, claim_max=100) for _ in range(3)]
    keys, per_key, unkeyed = 100, 10, 300
    sent: dict[str, list[int]] = defaultdict(list)
    ids: list[uuid.UUID] = []
    # Interleave keys across transactions, as independent requests would.
    for n in range(per_key):
        with Session(pg_engine) as session, session.begin():
            for k in range(keys):
                key = f"k{k}"
                ids.append(
                    outbox.enqueue(
                        session, exchange=exchange, routing_key="o", payload={"key": key, "n": n},
                        key=key,
                    )
                )  # fmt: skip
                sent[key].append(n)
            for u in range(unkeyed // per_key):
                ids.append(
                    outbox.enqueue(session, exchange=exchange, routing_key="o", payload={"u": u})
                )
    total = len(ids)
    arrivals = Arrivals(broker, queue)
    wait_until(
        lambda: arrivals.drain() >= total,
        timeout=120,
        interval=0.01,
        what=f"{total} distinct messages",
    )
    wait_until(lambda: states(pg_engine) == {"published": total}, timeout=30, what="published")
    arrivals.check(ids, sent)
    retried = sum(r.summary.retried for r in relays)
    assert retried > 0, "the scenario must include broker rejections"
    assert all(r.summary.published > 0 for r in relays), "every relay took part"


def test_a_stuck_key_holds_back_only_its_own_messages(
    db_url: str, app_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    # The head of key "stuck" goes to a queue that rejects everything, so it is retried again
    # and again; the rest of that key must wait, and nothing else may.
    rejecting = broker.declare_exchange()
    broker.declare_queue(
        bind_to=rejecting, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    with Session(app_engine) as session, session.begin():
        outbox.enqueue(session, exchange=rejecting, routing_key="r", payload={}, key="stuck")
        ex = broker.exchange
        behind = [
            outbox.enqueue(session, exchange=ex, routing_key="r", payload={}, key="stuck")
            for _ in range(5)
        ]
        free = [
            outbox.enqueue(session, exchange=broker.exchange, routing_key="r", payload={"i": i})
            for i in range(300)
        ]
        other_key = [
            outbox.enqueue(session, exchange=broker.exchange, routing_key="r", payload={}, key="ok")
            for _ in range(5)
        ]  # fmt: skip
    relay = relay_factory(db_url, policy=FAST_RETRIES)
    broker.collect_ids(free + other_key, timeout=20)
    wait_until(lambda: relay.summary.retried >= 3, what="the stuck head retried")
    delivered = {d.message_id for d in broker.received}
    assert not delivered & {str(i) for i in behind}


def _dead_head_then_three(engine: Engine, broker: Broker) -> tuple[uuid.UUID, list[uuid.UUID]]:
    orphan = broker.declare_exchange()  # nothing bound: unroutable, dead at once
    with Session(engine) as session, session.begin():
        head = outbox.enqueue(session, exchange=orphan, routing_key="r", payload={}, key="a")
        rest = [
            outbox.enqueue(session, exchange=broker.exchange, routing_key="r", payload={}, key="a")
            for _ in range(3)
        ]  # fmt: skip
    return head, rest


def test_a_dead_head_holds_its_key_until_an_operator_discards_it(
    db_url: str, app_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    head, rest = _dead_head_then_three(app_engine, broker)
    relay = relay_factory(db_url)  # dead_key="hold", the default
    wait_until(lambda: states(app_engine).get("dead") == 1, what="the head dead-lettered")
    # The three behind it came with it (a run) and were given back unsent, or never claimed.
    wait_until(lambda: relay.summary.claimed >= 1 and relay.in_flight == 0, what="settled")
    assert states(app_engine) == {"dead": 1, "pending": 3}  # held behind the dead head
    assert broker.received == []

    discarded = cli("--db", db_url, "discard", str(head), timeout=60)
    assert discarded.returncode == 0, discarded.stderr
    received = broker.collect_ids(rest, timeout=20)
    assert [d.message_id for d in received] == [str(i) for i in rest]


def test_with_skip_a_dead_head_does_not_hold_its_key(
    pg_url: str, pg_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    head, rest = _dead_head_then_three(pg_engine, broker)
    relay_factory(pg_url, dead_key="skip", sweep_interval=0.1)
    received = broker.collect_ids(rest, timeout=20)
    assert [d.message_id for d in received] == [str(i) for i in rest]
    wait_until(lambda: states(pg_engine) == {"dead": 1, "published": 3}, what="all settled")
    assert str(head) not in {d.message_id for d in received}
