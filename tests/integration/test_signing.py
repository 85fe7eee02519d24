"""Signed messages against real software: a relay signs what it publishes to the real RabbitMQ;
the Python `standardwebhooks` package, `outbox.verify` and a Node.js consumer (amqplib and the npm
`standardwebhooks`, the docs' own program) verify every one and refuse forged or altered copies;
`outbox.Consumer` dead-letters what does not verify; a rotation refuses nothing."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from sqlalchemy import Engine, text, update
from sqlalchemy.orm import Session

import outbox
from outbox.consumer import ERROR_HEADER, dead_queue
from outbox.schema import message
from outbox.signing import new_secret, signer
from relay.core.signing import keys_text
from tests.docs_blocks import block
from tests.support.broker import Broker, Delivery, amqp_connection
from tests.support.cli import environment, in_process
from tests.support.relays import RelayFactory, drive_until_settled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PAGE = "guides/signing.md"
NODE_DIR = Path(__file__).resolve().parents[1] / "node"


# --------------------------------------------------------------------------- helpers


def enqueue(engine: Engine, exchange: str, count: int, tag: str) -> list[str]:
    ids = []
    with engine.begin() as conn:
        for n in range(count):
            payload = {"n": n, "tag": tag, "text": "é" * n}
            ids.append(
                str(outbox.enqueue(conn, exchange=exchange, routing_key="sig", payload=payload))
            )
    return ids


def forgeries(genuine: Delivery) -> dict[str, tuple[bytes, pika.BasicProperties]]:
    """Copies of a genuine message someone else publishes: unsigned, one byte changed, its
    signature under another id."""
    headers = dict(genuine.properties.headers)
    other = str(uuid.uuid4())
    unsigned = {k: v for k, v in headers.items() if not k.startswith("webhook-")}
    body = bytearray(genuine.body)
    body[genuine.body.index(b"signed")] ^= 0x01  # "rigned": the JSON still parses
    cases = {
        "unsigned": (genuine.body, unsigned, str(uuid.uuid4())),
        "byte": (bytes(body), headers, str(uuid.uuid4())),
        "id": (genuine.body, {**headers, "webhook-id": other}, other),
    }
    return {
        name: (data, pika.BasicProperties(message_id=mid, headers=hdrs, delivery_mode=2))
        for name, (data, hdrs, mid) in cases.items()
    }


class Channel:
    """What the docs' pika callback needs of a channel: ack and reject, recorded."""

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.rejected: list[int] = []

    def basic_ack(self, tag: int) -> None:
        self.acked.append(tag)

    def basic_reject(self, tag: int, requeue: bool) -> None:
        assert requeue is False
        self.rejected.append(tag)


class Method:
    def __init__(self, tag: int) -> None:
        self.delivery_tag = tag


@pytest.fixture(scope="session")
def node_consumer() -> Path:
    """tests/node installed (`npm ci`, once, when node_modules is missing): the docs' consumer."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the Node.js interop test needs both")
    if not (NODE_DIR / "node_modules" / "standardwebhooks").is_dir():
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            pytest.fail(
                f"npm ci in {NODE_DIR} failed ({last}); offline, it needs npm's cache to hold "
                "amqplib and standardwebhooks: run `npm ci` there once with the network"
            )
    return NODE_DIR / "consumer.js"


def node_verdicts(
    program: Path, amqp_url: str, queue_name: str, secrets: str, count: int
) -> list[str]:
    """Run the Node consumer on `queue_name` until it has said `count` lines; those lines."""
    env = {**os.environ, "AMQP_URL": amqp_url, "QUEUE": queue_name, "OUTBOX_SIGNING_KEYS": secrets}
    process = subprocess.Popen(
        ["node", program.name], cwd=program.parent, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.strip())
        lines.put(None)  # the program ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    said: list[str] = []
    try:
        while len(said) < count:
            try:
                line = lines.get(timeout=20)
            except queue.Empty:
                pytest.fail(f"the Node consumer said {len(said)} of {count} lines: {said}")
            if line is None:
                assert process.stderr is not None
                pytest.fail(f"the Node consumer ended: {process.stderr.read()[-2000:]}")
            said.append(line)
    finally:
        process.terminate()
        process.wait(10)
        reader.join(10)  # at the end of its output once the process is gone
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    return said


# --------------------------------------------------------------------------- the proofs


@pytest.mark.xdist_group("node")  # npm ci, when needed, on one worker only
def test_relay_signed_messages_verify_in_python_and_node_and_forgeries_do_not(
    pg_url: str,
    pg_engine: Engine,
    broker: Broker,
    amqp_url: str,
    node_consumer: Path,
    tmp_path: Path,
) -> None:
    secrets = f"{new_secret()},{new_secret()}"  # two, as during a rotation
    node_queue = broker.declare_queue(bind_to=broker.exchange)
    ids = enqueue(pg_engine, broker.exchange, 5, "signed")
    # `outbox-relay run` as an operator starts it, the secrets in its environment.
    env = environment(OUTBOX_SIGNING_KEYS=secrets)
    argv = ["--db", pg_url, "--amqp", amqp_url, "run", "--poll-interval", "0.05"]
    log_path = tmp_path / "relay.log"
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            [sys.executable, "-m", "relay", *argv], env=env, stdout=log, stderr=log
        ) as relay,
    ):
        try:
            genuine = list(broker.collect_ids([uuid.UUID(i) for i in ids], timeout=20))
        finally:
            relay.send_signal(signal.SIGTERM)
            assert relay.wait(20) == 0, log_path.read_text()
    logged = log_path.read_text()
    assert "relay.signing" in logged, logged
    for secret in secrets.split(","):
        assert secret[6:] not in logged
    assert {d.message_id for d in genuine} == set(ids)

    forged: dict[str, tuple[bytes, pika.BasicProperties]] = {}
    for name, (body, props) in forgeries(genuine[0]).items():
        forged[props.message_id] = (body, props)
        broker.publish("sig", body, props, exchange=broker.exchange)
    arrived = broker.collect(lambda got: len(got) == 8, what="the forged copies")

    # Python: the standardwebhooks package (with either secret) and outbox.verify, as the docs show.
    python_sw: dict[str, Any] = {}
    exec(block(PAGE, "signing-standardwebhooks"), python_sw)
    verify_doc: dict[str, Any] = {}
    exec(block(PAGE, "signing-verify"), verify_doc)
    channel = Channel()
    os.environ["OUTBOX_SIGNING_KEYS"] = secrets
    try:
        for tag, delivery in enumerate(arrived):
            verify_doc["on_message"](channel, Method(tag), delivery.properties, delivery.body)
    finally:
        del os.environ["OUTBOX_SIGNING_KEYS"]
    assert [arrived[t].message_id for t in channel.acked] == [d.message_id for d in genuine]
    assert {arrived[t].message_id for t in channel.rejected} == set(forged)
    for delivery in genuine:
        assert delivery.properties.headers["webhook-id"] == delivery.message_id
        for secret in secrets.split(","):
            payload = python_sw["verified_payload"](secret, delivery.properties, delivery.body)
            assert payload["tag"] == "signed"
    for body, props in forged.values():
        with pytest.raises(Exception, match=r"signature|header"):
            python_sw["verified_payload"](secrets.split(",")[0], props, body)

    # Node.js: the docs' consumer, on a queue of its own that got the same eight messages.
    said = node_verdicts(node_consumer, amqp_url, node_queue, secrets, 8)
    verified = {line.split()[1] for line in said if line.startswith("verified ")}
    refused = {line.split()[1].rstrip(":") for line in said if line.startswith("refused ")}
    assert verified == set(ids), said
    assert refused == set(forged), said


def test_a_replayed_message_is_signed_again_with_the_current_secrets(
    pg_url: str, pg_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    old, new = new_secret(), new_secret()
    [message_id] = enqueue(pg_engine, broker.exchange, 1, "replayed")
    drive_until_settled(relay_factory(pg_url, run=False, signing_keys=keys_text(old)), 1)
    first = broker.collect(lambda got: len(got) == 1)[0]
    outbox.verify(first.body, first.properties.headers, old)
    # Only failed messages are replayed: this one is made dead, as a failed one ends.
    with pg_engine.begin() as conn:
        conn.execute(
            update(message).where(message.c.id == uuid.UUID(message_id)).values(state="dead")
        )
    code, out, err = in_process("--db", pg_url, "replay", message_id)
    assert code == 0, out + err
    assert "replayed 1" in out, out
    drive_until_settled(relay_factory(pg_url, run=False, signing_keys=keys_text(new)), 1)
    again = broker.collect(lambda got: len(got) == 2)[1]
    assert again.message_id == first.message_id == message_id
    assert again.body == first.body  # signing never changes the body
    outbox.verify(again.body, again.properties.headers, new)
    with pytest.raises(outbox.BadSignature):
        outbox.verify(again.body, again.properties.headers, old)


def test_the_consumer_dead_letters_what_does_not_verify(
    pg_engine: Engine, broker: Broker, amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = new_secret()
    q = broker.declare_queue()
    broker.own(dead_queue(q))
    body = b'{"order": 17}'

    def publish(message_id: str, data: bytes, headers: dict[str, Any]) -> None:
        props = pika.BasicProperties(
            message_id=message_id, content_type="application/json", headers=headers
        )
        broker.publish(q, data, props)

    good = str(uuid.uuid4())
    publish(good, body, signer(secret).headers(good, body))
    expected: dict[str, str] = {}
    unsigned = str(uuid.uuid4())
    publish(unsigned, body, {})
    expected[unsigned] = "bad signature: not signed: no webhook-id"
    other_key = str(uuid.uuid4())
    publish(other_key, body, signer(new_secret()).headers(other_key, body))
    expected[other_key] = "bad signature: no signature matches"
    changed = str(uuid.uuid4())
    publish(changed, body.replace(b"17", b"18"), signer(secret).headers(changed, body))
    expected[changed] = "bad signature: no signature matches"
    copied = str(uuid.uuid4())  # the genuine message, signature and all, under another id
    publish(copied, body, signer(secret).headers(good, body))
    expected[copied] = "bad signature: the signed webhook-id is not the message_id"

    handled: list[str] = []

    def handler(_session: Session, message: outbox.Message) -> None:
        handled.append(message.id)

    # The consumer as the docs build it.
    monkeypatch.setenv("OUTBOX_SIGNING_KEYS", secret)
    code = block(PAGE, "signing-consumer").replace('"billing.orders"', "queue_name")
    names: dict[str, Any] = {"engine": pg_engine, "amqp_url": amqp_url, "queue_name": q,
                             "on_order": handler}  # fmt: skip
    exec(code, names)
    consumer: outbox.Consumer = names["consumer"]
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        counts = consumer.processor.counts
        wait_until(lambda: sum(counts.values()) == 5, what="five deliveries handled")
    finally:
        consumer.stop()
        thread.join(10)
    assert counts == {"processed": 1, "bad_signature": 4}
    assert handled == [good]
    with pg_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_inbox")).scalar_one() == 1
    reasons: dict[str, str] = {}
    reader = amqp_connection()
    try:
        channel = reader.channel()
        while True:
            method, properties, _data = channel.basic_get(dead_queue(q), auto_ack=True)
            if method is None:
                break
            reasons[properties.message_id] = properties.headers[ERROR_HEADER]
    finally:
        reader.close()
    assert set(reasons) == set(expected)
    for message_id, words in expected.items():
        assert reasons[message_id].startswith(words), reasons[message_id]


def test_with_bad_secrets_the_consumer_does_not_start(pg_engine: Engine, amqp_url: str) -> None:
    with pytest.raises(ValueError, match="secret 2 of 2") as refused:
        outbox.Consumer(pg_engine, amqp_url, "q", lambda s, m: None,
                        signing_secrets=f"{new_secret()},whsec_hunter2%")  # fmt: skip
    assert "hunter2" not in str(refused.value)


# --------------------------------------------------------------------------- rotation


@pytest.fixture
def consumers(amqp_url: str) -> Iterator[Callable[..., outbox.Consumer]]:
    running: list[tuple[outbox.Consumer, threading.Thread]] = []

    def start(engine: Engine, queue_name: str, secrets: str) -> outbox.Consumer:
        consumer = outbox.Consumer(
            engine, amqp_url, queue_name, lambda s, m: None, name="rotation", prefetch=5,
            signing_secrets=secrets,
        )  # fmt: skip
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        assert consumer.ready.wait(10), "the consumer did not start"
        running.append((consumer, thread))
        return consumer

    yield start
    for consumer, thread in running:
        consumer.stop()
        thread.join(10)


def test_a_rotation_with_relays_and_consumers_updated_at_different_moments_refuses_nothing(
    pg_url: str,
    pg_engine: Engine,
    broker: Broker,
    relay_factory: RelayFactory,
    consumers: Callable[..., outbox.Consumer],
) -> None:
    old, new = new_secret(), new_secret()
    q = broker.declare_queue(bind_to=broker.exchange)
    broker.declare_queue(dead_queue(q))  # as the consumers would declare it, to count in it
    relays = {
        name: relay_factory(pg_url, run=False, signing_keys=keys_text(secrets))
        for name, secrets in (("old", old), ("both", f"{old},{new}"), ("new", new))
    }
    running: list[outbox.Consumer] = []
    sent = 0

    def start(secrets: str) -> None:
        running.append(consumers(pg_engine, q, secrets))
        started.append(running[-1])

    started: list[outbox.Consumer] = []

    def publish(relay: str, count: int = 6) -> None:
        nonlocal sent
        enqueue(pg_engine, broker.exchange, count, relay)
        drive_until_settled(relays[relay], count)
        sent += count

    def stop_oldest() -> None:
        consumer = running.pop(0)
        wait_until(lambda: broker.depth(q) == 0, what="the queue drained")
        consumer.stop()

    # Before: relays and consumers hold the old secret.
    start(old)
    publish("old")
    # 1. Consumers learn the new secret one by one, while relays still sign with the old one.
    start(f"{old},{new}")
    publish("old")
    stop_oldest()
    # 2. Relays sign with both, one by one: a relay not yet restarted still signs with the old.
    publish("both")
    publish("old")
    publish("both")
    # 3. Relays drop the old secret, one by one.
    publish("new")
    publish("both")
    # 4. Once the queues drained past step 2, consumers drop the old secret, one by one.
    start(new)
    publish("new")
    stop_oldest()
    publish("new")

    wait_until(lambda: _inbox(pg_engine) == sent, what=f"{sent} messages processed")
    assert [c.processor.counts.get("bad_signature", 0) for c in started] == [0, 0, 0]
    assert sum(c.processor.counts.get("processed", 0) for c in started) == sent
    assert broker.depth(dead_queue(q)) == 0


def _inbox(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM outbox_inbox")).scalar_one())


@pytest.mark.xdist_group("node")  # npm ci, when needed, on one worker only
def test_the_docs_consumer_is_the_one_the_tests_run(node_consumer: Path) -> None:
    assert node_consumer.read_text(encoding="utf-8") == block(PAGE, "node-consumer")
    assert json.loads((NODE_DIR / "package.json").read_text())["dependencies"] == {
        "amqplib": "2.3.1",
        "standardwebhooks": "1.1.1",
    }
