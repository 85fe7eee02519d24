"""`outbox-relay topology apply/check` against the real broker, each test in a vhost of its own:
apply declares, twice is the same as once, check changes nothing and names what is missing or
different, a refusal is one line naming the object and the difference, and a partitioned queue
routes a key to one partition while unkeyed messages spread over all of them."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest

from relay.amqp import topology
from relay.core.topology import read_topology
from tests.docs_blocks import block
from tests.support.cli import assert_one_line_error, cli, environment, in_process
from tests.support.vhosts import module_vhost_url, rabbitmqctl
from tests.support.waiting import wait_until

__all__ = ["module_vhost_url"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FILE = """
[[exchanges]]
name = "orders"
type = "topic"

[[queues]]
name = "billing"
arguments = { "x-max-length" = 1000 }
bindings = [{ exchange = "orders", routing_key = "order.*" }]

[[queues]]
name = "shipping"
bindings = [{ exchange = "orders", routing_key = "order.*" }]
partitions = 4
"""


def _queues(url: str) -> set[str]:
    vhost = url.rsplit("/", 1)[1]
    return set(rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name").split())


def _named(tag: str) -> str:
    """FILE with names of a test's own, so the module's tests share one vhost."""
    return (
        FILE.replace('"orders"', f'"orders-{tag}"')
        .replace('"billing"', f'"billing-{tag}"')
        .replace('"shipping"', f'"shipping-{tag}"')
    )


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "topology.toml"
    path.write_text(text)
    return str(path)


def test_apply_is_idempotent_and_check_sees_what_is_missing_or_different(
    tmp_path: Path, module_vhost_url: str
) -> None:
    path = _write(tmp_path, _named("a"))
    code, out, _ = in_process("topology", "check", path, "--amqp", module_vhost_url)
    assert code == 1
    assert "missing: exchange 'orders-a'" in out
    assert "missing: queue 'shipping-a.3'" in out
    assert not [q for q in _queues(module_vhost_url) if q.endswith(("-a", ".3"))], "declared"

    for _ in range(2):
        code, out, err = in_process("topology", "apply", path, "--amqp", module_vhost_url)
        assert code == 0, err
    assert {"billing-a", *(f"shipping-a.{i}" for i in range(4))} <= _queues(module_vhost_url)
    code, out, err = in_process("topology", "check", path, "--amqp", module_vhost_url)
    assert code == 0, err
    assert "the broker has all 9 exchanges and queues" in out
    assert "not checked: 11 bindings" in err

    changed = _write(tmp_path, _named("a").replace("1000", "5"))
    code, out, _ = in_process("topology", "check", changed, "--amqp", module_vhost_url)
    assert code == 1
    assert out.strip() == (
        "different: queue 'billing-a' exists on the broker with other settings: "
        "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'billing-a' in vhost "
        f"'{module_vhost_url.rsplit('/', 1)[1]}': received '5' but current is '1000'"
    )
    code, out, err = in_process("topology", "apply", changed, "--amqp", module_vhost_url)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"outbox-relay: topology failed: {changed}: queue 'billing-a' exists")
    assert "'x-max-length'" in err
    assert "received '5' but current is '1000'" in err


def test_a_key_stays_in_one_partition_and_unkeyed_messages_spread(module_vhost_url: str) -> None:
    topology.apply(module_vhost_url, read_topology(_named("b")))
    conn = pika.BlockingConnection(pika.URLParameters(module_vhost_url))
    try:
        channel = conn.channel()
        channel.confirm_delivery()

        def send(headers: dict[str, Any] | None) -> None:
            props = pika.BasicProperties(message_id=str(uuid.uuid4()), headers=headers)
            channel.basic_publish("orders-b", "order.created", b"{}", props, mandatory=True)

        def depths() -> list[int]:
            return [
                channel.queue_declare(f"shipping-b.{i}", passive=True).method.message_count
                for i in range(4)
            ]

        for _ in range(40):
            send({"x-outbox-key": "customer-7"})
        keyed = depths()
        assert sorted(keyed) == [0, 0, 0, 40], keyed
        for _ in range(400):
            send(None)
        unkeyed = [after - before for after, before in zip(depths(), keyed, strict=True)]
        assert sum(unkeyed) == 400
        assert min(unkeyed) > 50, unkeyed
    finally:
        conn.close()


def test_the_guides_file_applies_and_checks_and_its_consumer_reads_every_partition(
    tmp_path: Path, module_vhost_url: str
) -> None:
    path = _write(tmp_path, block("guides/topology.md", "topology-file"))
    code, _, err = in_process("topology", "apply", path, "--amqp", module_vhost_url)
    assert code == 0, err
    code, out, err = in_process("topology", "check", path, "--amqp", module_vhost_url)
    assert code == 0, out + err
    assert {"billing.orders", "orders.dead", "shipping.orders.3"} <= _queues(module_vhost_url)

    code_text = block("guides/topology.md", "topology-consumer")
    assert "consumer.run()" in code_text
    namespace: dict[str, Any] = {}
    exec(code_text.replace("consumer.run()", ""), namespace)  # builds it; runs nothing
    consumer = namespace["consumer"]
    assert consumer.queues == [f"shipping.orders.{i}" for i in range(4)]
    assert [p.queue for p in consumer.processors] == consumer.queues


def test_run_with_a_topology_the_broker_refuses_exits_1_in_one_line(
    tmp_path: Path, module_vhost_url: str
) -> None:
    topology.apply(module_vhost_url, read_topology(_named("d")))
    db = f"sqlite:///{tmp_path / 'outbox.db'}"
    env = environment(OUTBOX_DB_URL=db, OUTBOX_AMQP_URL=module_vhost_url)
    assert cli("migrate", env=env).returncode == 0
    changed = _write(tmp_path, _named("d").replace("1000", "5"))
    done = cli("run", "--topology", changed, env=env)
    line = assert_one_line_error(done, 1)
    assert line.startswith(f"outbox-relay: run failed: {changed}: queue 'billing-d' exists"), line
    assert "received '5' but current is '1000'" in line
    # The same file, as the broker has it: the relay declares it, then runs.
    env["OUTBOX_TOPOLOGY"] = _write(tmp_path, _named("d"))
    log = tmp_path / "relay.log"
    with log.open("w") as err:
        running = subprocess.Popen([sys.executable, "-m", "relay", "run"], env=env, stderr=err)
    try:
        wait_until(lambda: "relay.started" in log.read_text(), timeout=20, what="relay.started")
    finally:
        running.send_signal(signal.SIGTERM)
        running.wait(30)
    assert running.returncode == 0
    text = log.read_text()
    assert text.index("relay.topology_applied") < text.index("relay.started")
