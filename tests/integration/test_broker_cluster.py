"""Several broker URLs, the nodes of one cluster, for real: the relay connects to the first node
that answers, says which, and when its node goes away mid-run it fails over to another and
delivers everything.

The "nodes" are the real broker reached two ways: directly, and through a TCP proxy the test
cuts (tests/support/proxy.py); a dead node is a closed port.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

import outbox
from outbox.schema import attempt
from relay.amqp.publisher import Publisher
from relay.core.urls import node_name
from relay.errors import BrokerUnavailable, plain_broker_error
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.runtime.logs import LogfmtFormatter
from relay.store.sql_store import open_store
from tests.support.broker import Broker
from tests.support.db import row_count
from tests.support.proxy import TcpProxy
from tests.support.relays import RELAY_TEST_CONFIG
from tests.support.waiting import doing_io, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Start = Callable[[str, str], Relay]


def dead_url(amqp_url: str) -> str:
    """`amqp_url` on a port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    host_port = node_name(amqp_url)
    return amqp_url.replace(host_port, f"127.0.0.1:{port}", 1)


@pytest.fixture
def proxy(amqp_url: str) -> Iterator[TcpProxy]:
    host, port = node_name(amqp_url).rsplit(":", 1)
    tcp = TcpProxy(host, int(port))
    yield tcp
    tcp.close()


@pytest.fixture
def start_relay() -> Iterator[Start]:
    """`start_relay(db_url, amqp_urls)`: a relay running in a thread on those broker URLs;
    stopped, joined and closed at teardown."""
    running: list[tuple[Relay, threading.Thread]] = []

    def start(db_url: str, amqp_urls: str) -> Relay:
        relay_id = f"cluster-{uuid.uuid4().hex[:8]}"
        config = RelayConfig(
            db_url=db_url, amqp_url=amqp_urls, relay_id=relay_id, **RELAY_TEST_CONFIG
        )
        store = open_store(db_url)
        publisher = Publisher(amqp_urls, confirm_timeout=config.confirm_timeout,
                              name=config.relay_id)  # fmt: skip
        try:
            publisher.start()
        except BaseException:
            store.close()
            raise
        relay = wire_relay(store, publisher, config)
        thread = threading.Thread(target=relay.run, name=config.relay_id, daemon=True)
        thread.start()
        running.append((relay, thread))
        return relay

    yield start
    for relay, thread in running:
        relay.request_stop()
        thread.join(30)
        relay.store.close()
    assert not any(thread.is_alive() for _, thread in running), "a relay did not stop"


def enqueue(engine: Engine, exchange: str, n: int, tag: str) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange=exchange, routing_key="r", payload={"n": i, "tag": tag})
            for i in range(n)
        ]


def publisher_of(relay: Relay) -> Publisher:
    publisher = relay.publisher
    assert isinstance(publisher, Publisher)
    return publisher


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The fields of each `name` event the publisher logged."""
    return [r.__dict__ for r in caplog.records if r.name == "relay.publisher" and r.msg == name]


def test_a_dead_first_node_is_passed_over_and_the_node_used_is_logged(
    pg_engine: Engine,
    pg_url: str,
    broker: Broker,
    amqp_url: str,
    start_relay: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="relay.publisher")
    dead = dead_url(amqp_url)
    ids = enqueue(pg_engine, broker.exchange, 20, "a")
    relay = start_relay(pg_url, f"{dead},{amqp_url}")

    broker.collect_ids(ids)
    wait_until(lambda: row_count(pg_engine, state="published") == 20, what="rows published")
    assert publisher_of(relay).node == node_name(amqp_url)
    (lost,) = events(caplog, "broker.lost")
    assert (lost["node"], lost["next"]) == (node_name(dead), node_name(amqp_url))
    assert lost["retry_in"] == 0.0  # another node to try: at once
    (connected,) = events(caplog, "broker.connected")
    assert connected["node"] == node_name(amqp_url)
    # The lines as an operator reads them: the node, never the password.
    lines = [LogfmtFormatter().format(r) for r in caplog.records]
    assert any(f"broker.connected node={node_name(amqp_url)} " in line for line in lines), lines
    password = amqp_url.split("@")[0].rsplit(":", 1)[1]
    assert not any(f":{password}@" in line for line in lines), lines


def test_a_node_cut_mid_run_fails_over_to_the_next_and_everything_is_delivered(
    pg_engine: Engine,
    pg_url: str,
    broker: Broker,
    amqp_url: str,
    proxy: TcpProxy,
    start_relay: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    through_proxy = proxy.url_for(amqp_url, 5672)
    first = enqueue(pg_engine, broker.exchange, 1, "first")
    relay = start_relay(pg_url, f"{through_proxy},{amqp_url}")
    publisher = publisher_of(relay)
    assert publisher.node == node_name(through_proxy)
    broker.collect_ids(first)  # the exchange's channel is open through the first node

    # The first node takes messages and confirms none: the cut falls while the broker holds
    # messages the relay has not seen confirmed.
    proxy.hold()
    before = enqueue(pg_engine, broker.exchange, 600, "before")
    broker.collect(lambda received: len(received) > 1, timeout=30,
                   what="a message through the first node, its confirm held")  # fmt: skip
    proxy.cut()  # drops the connection and refuses new ones: that node is gone
    after = enqueue(pg_engine, broker.exchange, 100, "after")

    broker.collect_ids(first + before + after, timeout=40)
    wait_until(lambda: row_count(pg_engine, state="published") == 701, timeout=20,
               what="every row marked published")  # fmt: skip
    assert row_count(pg_engine, state="dead") == 0
    with pg_engine.connect() as conn:
        unconfirmed = conn.execute(
            select(func.count()).where(attempt.c.failure_class == "ambiguous")
        ).scalar_one()
    assert unconfirmed > 0, "the cut left no message awaiting its confirm: nothing was tested"
    # Those messages were lost with the connection, not by their exchange: no circuit opened
    # (it would have held the exchange back for its cooldown after the failover).
    assert not [r for r in caplog.records if r.msg == "circuit.opened"]
    assert publisher.node == node_name(amqp_url)
    assert publisher.connections == 2
    lost = events(caplog, "broker.lost")
    assert lost[0]["node"] == node_name(through_proxy)
    assert (lost[0]["next"], lost[0]["retry_in"]) == (node_name(amqp_url), 0.0)
    connected = [e["node"] for e in events(caplog, "broker.connected")]
    assert connected == [node_name(through_proxy), node_name(amqp_url)]


def test_after_every_node_failed_the_publisher_backs_off_then_starts_again_in_order(
    amqp_url: str, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relay.publisher")
    through_proxy, dead = proxy.url_for(amqp_url, 5672), dead_url(amqp_url)
    publisher = Publisher(f"{through_proxy},{dead}", reconnect_max_delay=1.0)
    publisher.start()
    try:
        assert publisher.node == node_name(through_proxy)
        proxy.cut()
        # Lost the first node, then the second refused: a whole round failed, so a backoff,
        # and the next round starts with the first node again.
        retried = doing_io(publisher, lambda: len(events(caplog, "broker.lost")) >= 3)
        wait_until(retried, timeout=15, what="the first node retried after a backoff")
        first, second, third = events(caplog, "broker.lost")[:3]
        assert (first["node"], first["retry_in"]) == (node_name(through_proxy), 0.0)
        assert (second["node"], second["next"]) == (node_name(dead), node_name(through_proxy))
        assert second["retry_in"] > 0
        assert third["node"] == node_name(through_proxy)
        proxy.restore()
        back = doing_io(publisher, lambda: publisher.ready)
        wait_until(back, timeout=15, what="reconnected to the first node")
        assert publisher.node == node_name(through_proxy)
    finally:
        publisher.stop()


def test_when_no_node_answers_one_line_says_why_for_each(
    amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relay.publisher")
    first, second = dead_url(amqp_url), dead_url(amqp_url)
    with pytest.raises(BrokerUnavailable) as caught:
        Publisher(f"{first},{second}").start()
    # As `outbox-relay run` prints it (relay.cli.main applies plain_broker_error).
    line = plain_broker_error(str(caught.value))
    refused = "connection refused: is RabbitMQ running and listening there?"
    assert f": {node_name(first)}: {refused}; {node_name(second)}: {refused}" in line, line
    password = amqp_url.split("@")[0].rsplit(":", 1)[1]
    assert f":{password}@" not in line
    assert events(caplog, "broker.lost") == []  # the one line says it all: no log line before
