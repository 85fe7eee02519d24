"""A real Dramatiq worker (the `dramatiq` command, its RabbitmqBroker) runs the actors that
`outbox.dramatiq_message` sent through a real relay: the docs' example (docs/guides/consumers.md,
blocks "dramatiq-actors" and "dramatiq-example"), and a delayed message through the queue's
delay queue.

The worker and the relay use a vhost of this module's own (created and deleted here), so the
docs' queue name and Dramatiq's delay and dead-letter queues meet no one else's. The actor's body
is the docs' with one line swapped in: it appends its arguments to a file the test reads.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import dramatiq
import dramatiq.broker
import pika
import pydantic
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import outbox
from tests.docs_blocks import block
from tests.support.db import states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

DOCS_AMQP = "amqp://guest:guest@localhost:5672/%2F"
DOCS_BODY = "    ...  # total is a Decimal's string, placed_at an ISO 8601 datetime\n"
RECORDING_BODY = (
    "    with open(os.environ['DRAMATIQ_RAN'], 'a') as ran:\n"
    "        ran.write(json.dumps([order_id, total, placed_at, notify, time.time()]) + '\\n')\n"
)
BIN = Path(sys.executable).parent


class Money(pydantic.BaseModel):
    amount: Decimal
    currency: str


class Notify(enum.StrEnum):
    BY_MAIL = "mail"


def _rabbitmqctl(*args: str) -> None:
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    subprocess.run([ctl, "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def amqp_url(amqp_url: str) -> Iterator[str]:
    """The tests' broker (checked by the session's `amqp_url`), on a vhost of this module's own:
    the relays of `relay_factory` publish there too."""
    vhost = f"dramatiq-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield amqp_url.rsplit("/", 1)[0] + "/" + quote(vhost, safe="")
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def _consumers(url: str, queue: str) -> int:
    """Consumers of `queue` on `url`'s vhost; 0 when the queue does not exist yet."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.consumer_count)
    except pika.exceptions.ChannelClosedByBroker:  # 404: not declared yet
        return 0
    finally:
        conn.close()


class Worker:
    """`dramatiq tasks` in a subprocess; `ran()` reads what its actor was called with."""

    def __init__(self, directory: Path, process: subprocess.Popen[bytes]) -> None:
        self.directory = directory
        self.process = process
        self.record = directory / "ran.jsonl"

    def ran(self) -> list[list[Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


@pytest.fixture(scope="module")
def worker(amqp_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    directory = tmp_path_factory.mktemp("dramatiq")
    code = block("guides/consumers.md", "dramatiq-actors")
    assert DOCS_AMQP in code, "the docs' actors block no longer names the broker"
    assert DOCS_BODY in code, "the docs' actor has another body"
    code = code.replace(DOCS_AMQP, amqp_url).replace(DOCS_BODY, RECORDING_BODY)
    (directory / "tasks.py").write_text("import json, os, time\n" + code)
    env = {**os.environ, "DRAMATIQ_RAN": str(directory / "ran.jsonl")}
    command = [str(BIN / "dramatiq"), "tasks", "--path", str(directory)]
    command += ["--processes", "1", "--threads", "2", "--worker-shutdown-timeout", "5000"]
    log = (directory / "worker.log").open("wb")
    process = subprocess.Popen(command, cwd=directory, env=env, stdout=log, stderr=log)
    try:
        # Consuming the queue and its delay queue: what the relay publishes is routed at once.
        wait_until(
            lambda: (
                process.poll() is not None
                or (_consumers(amqp_url, "mail") and _consumers(amqp_url, "mail.DQ"))
            ),
            timeout=30,
            what="the Dramatiq worker to consume its queues",
        )
        assert process.poll() is None, (directory / "worker.log").read_text()
        yield Worker(directory, process)
    finally:
        process.send_signal(signal.SIGTERM)  # Dramatiq's graceful stop, its workers' too
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


@pytest.fixture
def tasks(worker: Worker) -> Iterator[Any]:
    """The docs' `tasks` module, imported as the application imports it; the process's global
    Dramatiq broker is put back afterwards."""
    before = dramatiq.broker.global_broker
    sys.path.insert(0, str(worker.directory))
    try:
        import tasks  # type: ignore[import-not-found]  # the file the worker fixture wrote

        yield tasks
        dramatiq.get_broker().close()
    finally:
        sys.modules.pop("tasks", None)
        sys.path.remove(str(worker.directory))
        dramatiq.broker.global_broker = before


def test_a_dramatiq_worker_runs_the_actor_the_docs_snippet_sent(
    pg_url: str, pg_engine: Engine, relay_factory: RelayFactory, worker: Worker, tasks: Any
) -> None:
    namespace: dict[str, Any] = {}
    code = block("guides/consumers.md", "dramatiq-example")
    exec(compile(code, "docs/guides/consumers.md (dramatiq-example)", "exec"), namespace)
    already, sent = len(worker.ran()), time.time()
    namespace["place_order"](pg_engine, 42, Decimal("19.90"))
    relay_factory(pg_url)

    (ran,) = wait_until(lambda: worker.ran()[already:], timeout=20, what="the actor to run")
    order_id, total, placed_at, notify, _ = ran
    assert (order_id, total, notify) == (42, "19.90", True)
    placed = dt.datetime.fromisoformat(placed_at)
    assert placed.utcoffset() == dt.timedelta(0)
    assert abs(placed.timestamp() - sent) < 30
    wait_until(lambda: states(pg_engine) == {"published": 1}, what="the row marked published")


def test_a_delayed_message_waits_in_the_delay_queue_then_runs(
    pg_url: str, pg_engine: Engine, relay_factory: RelayFactory, worker: Worker
) -> None:
    """By the actor's name alone (the application need not import the worker's code), with
    arguments of the types outbox encodes beyond JSON's own."""
    already = len(worker.ran())
    order_id = uuid.UUID("0190a5d4-8f3e-7c41-9d2b-5e6f7a8b9c0d")
    message = outbox.dramatiq_message_with_options(
        "send_confirmation",
        queue_name="mail",
        args=[order_id, Money(amount=Decimal("5.00"), currency="EUR")],
        kwargs={"placed_at": dt.datetime(2030, 1, 2, tzinfo=dt.UTC), "notify": Notify.BY_MAIL},
        delay=dt.timedelta(milliseconds=400),
    )
    with Session(pg_engine) as session, session.begin():
        outbox.enqueue(session, **message)
    relay_factory(pg_url)

    ran = wait_until(lambda: worker.ran()[already:], timeout=20, what="the delayed actor to run")
    assert [entry[:4] for entry in ran] == [
        [str(order_id), {"amount": "5.00", "currency": "EUR"}, "2030-01-02T00:00:00+00:00", "mail"]
    ]
    eta = message["payload"]["options"]["eta"]
    assert ran[0][4] * 1000 >= eta  # not before its eta
