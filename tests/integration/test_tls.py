"""TLS to the broker for real, without touching the machine's RabbitMQ: a TLS-terminating proxy
(tests/support/tls.py) in front of its plain port, certificates made by `openssl` for the test.

The relay runs as an operator runs it (`outbox-relay run` with --amqp-ca-file, --amqp-cert-file,
--amqp-key-file, --amqp-server-name) over mutual TLS; a wrong CA, a certificate for another name
or a missing client certificate fail at start in one line that names the option to fix, and
nothing is published. The consumer helper and the topology declaration take the same nodes.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from relay.amqp import topology
from relay.amqp.nodes import ssl_options
from relay.amqp.publisher import Publisher
from relay.amqp.tls import TlsOptions
from relay.core.urls import node_name
from relay.errors import BrokerUnavailable, plain_broker_error
from tests.e2e.test_telemetry_cli import free_port, get
from tests.support.broker import Broker
from tests.support.cli import assert_one_line_error, cli, environment
from tests.support.db import states
from tests.support.tls import SERVER_NAME, Certificates, TlsProxy, make_certificates
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_proxy(amqp_url: str, certs: Certificates) -> Iterator[TlsProxy]:
    """TLS in front of the broker; a client certificate signed by the test CA required."""
    host, port = node_name(amqp_url).rsplit(":", 1)
    with TlsProxy((host, int(port)), certs, client_ca=certs.ca) as proxy:
        yield proxy


def dead_amqps() -> str:
    """An amqps:// URL on a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"amqps://guest:guest@127.0.0.1:{s.getsockname()[1]}/%2F"


def tls_flags(certs: Certificates, *, ca: Path | None = None) -> list[str]:
    return ["--amqp-ca-file", str(ca or certs.ca),
            "--amqp-cert-file", str(certs.client_cert),
            "--amqp-key-file", str(certs.client_key),
            "--amqp-server-name", SERVER_NAME]  # fmt: skip


def enqueue(engine: Engine, exchange: str, n: int) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange=exchange, routing_key="order.created", payload={"n": i})
            for i in range(n)
        ]


def test_the_relay_publishes_over_mutual_tls_to_the_first_node_that_answers(
    pg_engine: Engine, pg_url: str, broker: Broker, tls_proxy: TlsProxy, certs: Certificates,
    tmp_path: Path,
) -> None:  # fmt: skip
    ids = enqueue(pg_engine, broker.exchange, 30)
    dead, port = dead_amqps(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "relay", "--db", pg_url, "run",
         "--amqp", f"{dead},{tls_proxy.url()}", *tls_flags(certs),
         "--poll-interval", "0.05", "--drain-timeout", "5",
         "--http-port", str(port), "--http-host", "127.0.0.1"],
        cwd=tmp_path, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        broker.collect_ids(ids, timeout=30)
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, timeout=15,
                   what="/readyz")  # fmt: skip
        ready = json.loads(get(f"http://127.0.0.1:{port}/readyz")[1])
        assert ready["broker_node"] == node_name(tls_proxy.url())
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert states(pg_engine) == {"published": 30}
    # The proxy saw the relay's client certificate on every connection it accepted.
    assert tls_proxy.handshakes == ["outbox-relay"], tls_proxy.handshakes
    assert f"broker.lost node={node_name(dead)} " in err
    assert f"broker.connected node={node_name(tls_proxy.url())} " in err
    assert ":guest@" not in err


def test_a_wrong_ca_stops_the_relay_in_one_line_and_nothing_is_published(
    pg_engine: Engine, pg_url: str, broker: Broker, tls_proxy: TlsProxy, certs: Certificates,
    tmp_path: Path,
) -> None:  # fmt: skip
    enqueue(pg_engine, broker.exchange, 3)
    result = cli("--db", pg_url, "run", "--amqp", tls_proxy.url(),
                 *tls_flags(certs, ca=certs.other_ca), cwd=tmp_path)  # fmt: skip
    line = assert_one_line_error(result, 1)
    assert "the broker's TLS certificate was refused" in line
    assert "--amqp-ca-file" in line
    assert ":guest@" not in line
    assert states(pg_engine) == {"pending": 3}
    assert broker.finish() == []
    assert tls_proxy.handshakes == []  # the relay gave up during the handshake


def start_error(url: str, tls: TlsOptions) -> str:
    """What the publisher (and so `outbox-relay run`, through plain_broker_error) says when it
    cannot connect."""
    with pytest.raises(BrokerUnavailable) as caught:
        Publisher(url, tls=tls).start()
    return plain_broker_error(str(caught.value))


def test_a_certificate_for_another_name_needs_the_server_name_option(
    tls_proxy: TlsProxy, certs: Certificates
) -> None:
    # The certificate names rabbit.test; the URL says 127.0.0.1.
    message = start_error(tls_proxy.url(), TlsOptions(ca_file=str(certs.ca)))
    assert "certificate is not valid for '127.0.0.1'" in message
    assert "--amqp-server-name" in message


def test_a_broker_that_wants_a_client_certificate_says_so(
    tls_proxy: TlsProxy, certs: Certificates
) -> None:
    message = start_error(
        tls_proxy.url(), TlsOptions(ca_file=str(certs.ca), server_name=SERVER_NAME)
    )
    assert "--amqp-cert-file" in message
    wait_until(lambda: tls_proxy.refused == 1,
               what="the proxy refusing the handshake without a client certificate")  # fmt: skip
    assert tls_proxy.handshakes == []


def test_the_consumer_and_the_topology_take_the_nodes_and_the_tls_options(
    pg_engine: Engine, broker: Broker, tls_proxy: TlsProxy, certs: Certificates
) -> None:
    tls = TlsOptions(ca_file=str(certs.ca), cert_file=str(certs.client_cert),
                     key_file=str(certs.client_key), server_name=SERVER_NAME)  # fmt: skip
    nodes = f"{dead_amqps()},{tls_proxy.url()}"
    exchange = broker.own_exchange(f"t.{uuid.uuid4().hex[:12]}")
    queue = broker.own(f"{exchange}.q")
    topology.declare(nodes, exchange, queue, "order.#", durable=True, tls=tls)

    received: list[str] = []

    def handle(_session: Session, message: outbox.Message) -> None:
        received.append(message.text())

    consumer = outbox.Consumer(pg_engine, nodes, queue, handle, ssl_options=ssl_options(tls))
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        assert consumer.ready.wait(15), "the consumer did not start"
        for n in range(3):
            properties = pika.BasicProperties(message_id=str(uuid.uuid4()),
                                              content_type="text/plain")  # fmt: skip
            broker.publish("order.created", f"order {n}".encode(), properties, exchange=exchange)
        wait_until(lambda: len(received) == 3, timeout=15, what="three messages consumed")
    finally:
        consumer.stop()
        thread.join(10)
    assert sorted(received) == ["order 0", "order 1", "order 2"]
    # Both went through TLS with the client certificate: the declaration, then the consumer.
    assert tls_proxy.handshakes == ["outbox-relay", "outbox-relay"]
