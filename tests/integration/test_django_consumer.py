"""`manage.py outbox_consume` in the real Django project (tests/django_project): the billing handler
writes an Invoice with the ORM for each order message, inside the consumer's atomic block with the
inbox row. Through handler failures after the write, duplicate deliveries and consumers killed
with SIGKILL and started again, every order gets exactly one invoice. SIGTERM drains and exits 0;
a bad handler path is one line. On PostgreSQL and SQLite, each a database of its own per module
(tests/integration/test_django.py makes them).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest
from sqlalchemy import Engine, create_engine, text

from outbox.consumer import dead_queue, retry_queue
from tests.integration.test_django import PROJECT, Site, made_site
from tests.support.broker import Broker, amqp_connection
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.xdist_group("django-consumer"),
]

HANDLER = "shop.handlers.bill"


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    with made_site(request.param, request, tmp_path_factory) as made:
        yield made


@pytest.fixture
def engine(site: Site) -> Iterator[Engine]:
    """The project's database, with no invoice and no inbox row left by an earlier test."""
    made = create_engine(site.url)
    with made.begin() as conn:
        conn.execute(text("DELETE FROM shop_invoice"))
        conn.execute(text("DELETE FROM outbox_inbox"))
    yield made
    made.dispose()


@pytest.fixture
def queue(broker: Broker) -> str:
    """A queue of the test's own, with the retry and dead-letter queues the consumer declares."""
    name = broker.declare_queue()
    for delay in (1, 2, 4, 8):
        broker.own(retry_queue(name, delay))
    broker.own(dead_queue(name))
    return name


@dataclass
class Running:
    """A `manage.py outbox_consume` process, its output in files."""

    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def running(self) -> bool:
        """True while the process runs; fails the test with its output once it has exited."""
        code = self.process.poll()
        if code is not None:
            pytest.fail(f"outbox_consume exited {code}:\n{self.err.read_text()}", pytrace=False)
        return True

    def kill(self) -> None:
        """SIGKILL: whatever the block in hand was doing is lost with the process."""
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> str:
        """SIGTERM; the exit (0) and the last line, the command's summary."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(20)
        assert code == 0, self.err.read_text()
        return self.out.read_text().strip().splitlines()[-1]


@pytest.fixture
def consumers(site: Site, amqp_url: str, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    """Start `manage.py outbox_consume QUEUE --handler shop.handlers.bill ARGS` processes (the
    broker's URL from the environment); any still running at the end is killed."""
    started: list[Running] = []

    def start(queue: str, *args: str) -> Running:
        n = len(started)
        out, err = tmp_path / f"consumer-{n}.out", tmp_path / f"consumer-{n}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "outbox_consume", queue, "--handler", HANDLER, *args],
                cwd=PROJECT,
                env=site.environment(OUTBOX_AMQP_URL=amqp_url),
                stdout=stdout,
                stderr=stderr,
            )
        started.append(Running(process, out, err))
        return started[-1]

    yield start
    for running in started:
        if running.process.poll() is None:
            running.kill()


def publish_orders(
    broker: Broker, queue: str, orders: range, *, copies: int = 1, fail_first: int = 0
) -> None:
    """One order message per id (`copies` deliveries of each, one message id); every
    `fail_first`-th order's handler fails once after its write."""
    for order in orders:
        body = {
            "id": order,
            "total": order,
            "fail_first": bool(fail_first) and order % fail_first == 0,
        }
        props = pika.BasicProperties(
            message_id=str(uuid.uuid4()), content_type="application/json", delivery_mode=2
        )
        for _ in range(copies):
            broker.publish(queue, json.dumps(body).encode(), props)


def invoices(engine: Engine) -> dict[int, int]:
    """Invoices per order id."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT order_id, count(*) FROM shop_invoice GROUP BY order_id"))
        return {int(order): int(n) for order, n in rows}


def drained(queue: str) -> bool:
    """Nothing waits in `queue` or in its 1-second retry queue (not declared: nothing did)."""
    conn = amqp_connection()
    try:
        for name in (queue, retry_queue(queue, 1)):
            channel = conn.channel()
            try:
                if channel.queue_declare(name, passive=True).method.message_count:
                    return False
            except pika.exceptions.ChannelClosedByBroker:
                continue  # NOT_FOUND: the channel is closed with it
            channel.close()
        return True
    finally:
        conn.close()


def test_handler_writes_happen_once_through_failures_and_duplicates(
    engine: Engine,
    broker: Broker,
    queue: str,
    consumers: Callable[..., Running],
) -> None:
    publish_orders(broker, queue, range(1, 31), copies=2, fail_first=3)
    consumer = consumers(queue)
    wait_until(
        lambda: consumer.running() and len(invoices(engine)) == 30 and drained(queue),
        timeout=40,
        interval=0.1,
        what="an invoice for each of the 30 orders",
    )
    summary = consumer.stop()
    assert summary.startswith("outbox_consume: stopped (")
    assert invoices(engine) == dict.fromkeys(range(1, 31), 1)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_inbox")).scalar_one() == 30


# On PostgreSQL only: each restart costs a Django start-up.
@pytest.mark.parametrize("site", ["postgresql"], indirect=True)
def test_sigkilled_consumers_lose_no_order_and_bill_none_twice(
    engine: Engine,
    broker: Broker,
    queue: str,
    consumers: Callable[..., Running],
) -> None:
    orders = range(1, 161)
    publish_orders(broker, queue, range(1, 31), copies=2, fail_first=7)  # each delivered twice
    publish_orders(broker, queue, range(31, 161), fail_first=7)
    consumer = consumers(queue, "--prefetch", "20")
    for progress in (30, 70, 110):

        def billed(enough: int = progress) -> bool:
            return consumer.running() and sum(invoices(engine).values()) >= enough

        wait_until(billed, timeout=30, what=f"{progress} invoices")
        consumer.kill()
        assert len(invoices(engine)) < len(orders), "killed after the stream, not in it"
        consumer = consumers(queue, "--prefetch", "20")
    wait_until(
        lambda: consumer.running() and len(invoices(engine)) == len(orders) and drained(queue),
        timeout=60,
        interval=0.1,
        what="an invoice for every order",
    )
    consumer.stop()
    assert invoices(engine) == dict.fromkeys(orders, 1)


def test_a_bad_handler_path_is_one_line(tmp_path: Path) -> None:
    # The command fails before it opens the database or the broker.
    nowhere = Site({"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db")}, "")
    result = nowhere.try_manage("outbox_consume", "q", "--handler", "shop.nowhere.bill")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "CommandError: --handler shop.nowhere.bill: No module named 'shop.nowhere'"
    ]
