"""The docker-compose demo's services as processes: producer, relay, consumer, one trace each."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.broker import AMQP_URL, Broker
from tests.support.cli import cli, environment
from tests.support.waiting import wait_until


def test_producer_relay_and_consumer_share_each_messages_trace(
    broker: Broker, sqlite_url: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    exchange = broker.own_exchange(f"t.demo.{suffix}")
    queue = broker.own(f"t.demo.{suffix}.orders")
    broker.own(f"{queue}.dead")
    names = ["--exchange", exchange, "--queue", queue]
    produced = cli("--db", sqlite_url, "--amqp", AMQP_URL, "demo-producer", "--orders", "5",
                   "--rate", "50", *names, cwd=tmp_path)  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    sent = dict(re.findall(r"message (\S+) trace ([0-9a-f]{32})", produced.stdout))
    assert len(sent) == 5

    out = tmp_path / "consumer.out"
    with out.open("w") as stdout:
        relay = subprocess.Popen(
            [sys.executable, "-m", "relay", "--db", sqlite_url, "--amqp", AMQP_URL, "run"],
            cwd=tmp_path, env=environment(), stderr=subprocess.DEVNULL,
        )  # fmt: skip
        consumer = subprocess.Popen(
            [sys.executable, "-m", "relay", "--db", sqlite_url, "--amqp", AMQP_URL,
             "demo-consumer", *names],
            cwd=tmp_path, env=environment(), stdout=stdout, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:

            def received() -> dict[str, str]:
                found = re.findall(r"received (\S+) trace ([0-9a-f]{32})", out.read_text())
                return dict(found) if len(found) >= 5 else {}

            got = wait_until(received, timeout=30, what="5 messages at the demo consumer")
        finally:
            for process in (consumer, relay):
                process.send_signal(signal.SIGTERM)
            for process in (consumer, relay):
                assert process.wait(30) == 0
    assert got == sent  # each message arrived once, in its producer's trace
