"""The broker: a topic exchange and a durable queue of each test's own on the real RabbitMQ, with
a collector for what arrives; helpers declare further exchanges and queues that are deleted with
them. OUTBOX_TEST_AMQP_URL points the tests at another broker; when it is not reachable (or blocks
publishers under an alarm), the tests that need it fail with one line saying so."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pika
import pytest

# A broker (vhost) the tests may declare names in.
AMQP_URL = os.environ.get("OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One message as a consumer received it."""

    message_id: str | None
    properties: Any  # pika.BasicProperties
    body: bytes
    exchange: str
    routing_key: str
    received_at: float  # time.monotonic() when the collector saw it


def amqp_connection() -> Any:
    params = pika.URLParameters(AMQP_URL)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.heartbeat = 0  # the test thread does not service heartbeats between polls
    return pika.BlockingConnection(params)


class Broker:
    """A per-test destination on the real broker, and a consumer of its queue.

    `exchange` (topic) routes everything (`#`) to `queue`. Deliveries are pushed to an auto-ack
    consumer with a large prefetch and accumulate in `received`, in arrival order, as the test
    calls `collect()`.
    """

    def __init__(self, conn: Any, suffix: str) -> None:
        self._conn = conn
        self._channel = conn.channel()
        self.exchange = f"t.{suffix}"
        self.queue = f"t.{suffix}.q"
        self.received: list[Delivery] = []
        self._exchanges: list[str] = []
        self._queues: list[str] = []
        self.declare_exchange(self.exchange)
        self.declare_queue(self.queue, bind_to=self.exchange)
        self._channel.basic_qos(prefetch_count=1000)
        self._consumer: str | None = self._channel.basic_consume(self.queue, self._on_consumed)

    # ---- topology: everything declared here is deleted at teardown

    def declare_exchange(self, name: str | None = None) -> str:
        """A durable topic exchange (a fresh `t.<random>` name unless given)."""
        name = name or f"t.{uuid.uuid4().hex[:12]}"
        self._channel.exchange_declare(name, exchange_type="topic", durable=True)
        self._exchanges.append(name)
        return name

    def declare_queue(
        self,
        name: str | None = None,
        *,
        bind_to: str | None = None,
        binding_key: str = "#",
        arguments: Mapping[str, Any] | None = None,
    ) -> str:
        """A durable queue, optionally bound to `bind_to` with `binding_key`."""
        name = name or f"t.{uuid.uuid4().hex[:12]}.q"
        self._channel.queue_declare(name, durable=True, arguments=dict(arguments or {}))
        self._queues.append(name)
        if bind_to is not None:
            self._channel.queue_bind(name, bind_to, routing_key=binding_key)
        return name

    def own(self, queue: str) -> str:
        """Delete `queue` at teardown too (one that the code under test declared)."""
        self._queues.append(queue)
        return queue

    def own_exchange(self, exchange: str) -> str:
        """Delete `exchange` at teardown too (one that the code under test declared)."""
        self._exchanges.append(exchange)
        return exchange

    def publish(self, routing_key: str, body: bytes, properties: Any, exchange: str = "") -> None:
        self._channel.basic_publish(exchange, routing_key, body, properties)

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange now (an outage); its bindings go with it."""
        self._channel.exchange_delete(name)

    def bind(self, queue: str, exchange: str, binding_key: str = "#") -> None:
        self._channel.queue_bind(queue, exchange, routing_key=binding_key)

    def depth(self, queue: str | None = None) -> int:
        """Ready messages in a queue (messages already pushed to a consumer are not counted)."""
        ok = self._channel.queue_declare(queue or self.queue, passive=True)
        return int(ok.method.message_count)

    # ---- consuming

    def _on_consumed(self, ch: Any, method: Any, properties: Any, body: bytes) -> None:
        # Manual acks: a delivery that pika drops (one arriving between basic.cancel and
        # cancel-ok is discarded) stays unacked on the broker and is recovered by finish(); with
        # auto-ack it would be lost to the test, which would then report a loss that is not real.
        self._on_message(ch, method, properties, body)
        ch.basic_ack(method.delivery_tag)

    def _on_message(self, _ch: Any, method: Any, properties: Any, body: bytes) -> None:
        self.received.append(
            Delivery(
                properties.message_id,
                properties,
                body,
                method.exchange,
                method.routing_key,
                time.monotonic(),
            )
        )

    def collect(
        self,
        until: Callable[[list[Delivery]], bool],
        *,
        timeout: float = 10.0,
        what: str = "",
    ) -> list[Delivery]:
        """Receive until `until(received)` holds; fail after `timeout` s. Returns `received`."""
        deadline = time.monotonic() + timeout
        while not until(self.received):
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(
                    f"timed out after {timeout} s waiting for {what or 'deliveries'}: "
                    f"{len(self.received)} received"
                )
            self._conn.process_data_events(time_limit=min(0.05, left))
        return self.received

    def collect_ids(self, ids: Sequence[uuid.UUID], *, timeout: float = 10.0) -> list[Delivery]:
        """Receive until every one of `ids` has arrived."""
        wanted = {str(i) for i in ids}

        def arrived(received: list[Delivery]) -> bool:
            return wanted <= {d.message_id for d in received}

        return self.collect(arrived, timeout=timeout, what=f"{len(wanted)} message ids")

    def finish(self) -> list[Delivery]:
        """Stop consuming and return everything that was delivered to the queue, exactly.

        After the broker's cancel-ok nothing more reaches this consumer, and whatever was
        already on its way is in `received`; what the queue still holds is added by reading it.
        Call it once every publisher has stopped, to count deliveries without waiting.
        """
        if self._consumer is not None:
            for method, properties, body in self._channel.basic_cancel(self._consumer):
                self._on_consumed(self._channel, method, properties, body)
            self._consumer = None
            # Whatever reached the client but was not handed to us goes back to the queue.
            self._channel.basic_recover(requeue=True)
        left = self._channel.queue_declare(self.queue, passive=True).method.message_count
        if left:
            # Streamed to a consumer: a basic_get each is a round trip per message, minutes for a
            # backlog of 20,000 on a busy machine. Acked one by one, so what its cancel finds
            # unacked goes back to the queue for the basic_get below (`left` may miss messages
            # the recover is still requeueing).
            stream = self._channel.consume(self.queue, inactivity_timeout=5.0)
            for method, properties, body in stream:
                if method is None:
                    break
                self._on_consumed(self._channel, method, properties, body)
                left -= 1
                if not left:
                    break
            self._channel.cancel()
        while True:  # whatever the stream did not take
            method, properties, body = self._channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                return self.received
            self._on_message(self._channel, method, properties, body)

    def delete(self) -> None:
        """Delete every queue and exchange this destination declared."""
        # A channel the test got closed (a passive declare of a missing queue, say) is replaced.
        channel = self._channel if self._channel.is_open else self._conn.channel()
        if self._consumer is not None and channel is self._channel:
            with contextlib.suppress(Exception):
                channel.basic_cancel(self._consumer)
        for queue in self._queues:
            channel.queue_delete(queue)
        for exchange in self._exchanges:
            channel.exchange_delete(exchange)


def broker_refuses_publishes() -> str | None:
    """Publish one confirmed message to a private queue; say why not if the broker will not take it.

    A broker under a resource alarm (low disk, high memory) accepts connections and declarations
    but blocks every publisher: without this check each delivery test would time out on its own,
    one by one, with "0 received" and no word about the alarm.
    """
    params = pika.URLParameters(AMQP_URL)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.heartbeat = 0
    params.blocked_connection_timeout = 10
    conn = pika.BlockingConnection(params)
    blocked: list[str] = []
    conn.add_on_connection_blocked_callback(
        lambda _c, frame: blocked.append(str(getattr(frame.method, "reason", "") or "no reason"))
    )
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        channel.basic_publish("", queue, b"preflight", mandatory=True)
        return None
    except pika.exceptions.ConnectionBlockedTimeout:
        why = ", ".join(blocked) or "a resource alarm"
        return f"it blocks publishers ({why}; `rabbitmq-diagnostics alarms` names it)"
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The broker's URL; fails (one line) every test that needs it when it is not reachable."""
    problem = None
    try:
        problem = broker_refuses_publishes()
    except Exception as exc:
        problem = str(exc).strip() or repr(exc)  # pika's connection errors have no str()
    if problem is not None:  # outside the except block: no chained traceback, one line
        pytest.fail(
            f"RabbitMQ at {AMQP_URL} cannot take the tests' messages: {problem}; "
            "scripts/ensure-services.sh starts a stopped one",
            pytrace=False,
        )
    return AMQP_URL


@pytest.fixture
def broker(amqp_url: str) -> Iterator[Broker]:
    """A topic exchange and a bound durable queue of this test's own, deleted at teardown."""
    conn = amqp_connection()
    try:
        destination = Broker(conn, uuid.uuid4().hex[:12])
        try:
            yield destination
        finally:
            destination.delete()
    finally:
        conn.close()
