"""The baseline: how fast raw pika can publish these messages with publisher confirms.

pika's asynchronous adapter (`SelectConnection`), one channel in confirm mode, persistent and
mandatory messages to a durable queue through a topic exchange, at most `window` unconfirmed at
once. Bodies and properties are built before the clock starts; the rate runs from the first
`basic_publish` to the last confirm. Nothing here is relay code: it is the bound the relay is
measured against.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pika
from pika import spec
from pika.adapters.select_connection import SelectConnection

from benchmarks.machine import CpuMeter, CpuSplit


@dataclass(frozen=True, slots=True)
class CeilingResult:
    messages: int
    seconds: float
    acked: int
    nacked: int
    returned: int
    cpu: CpuSplit | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


class CeilingError(RuntimeError):
    """The ceiling run could not complete."""


class _Run:
    def __init__(
        self,
        amqp_url: str,
        exchange: str,
        routing_key: str,
        bodies: Sequence[bytes],
        properties: Sequence[Any],
        window: int,
        timeout: float,
    ) -> None:
        self.params = pika.URLParameters(amqp_url)
        self.params.connection_attempts = 1
        self.exchange = exchange
        self.routing_key = routing_key
        self.bodies = bodies
        self.properties = properties
        self.window = window
        self.timeout = timeout
        self.total = len(bodies)
        self.sent = 0
        self.settled = 0
        self.acked = 0
        self.nacked = 0
        self.returned = 0
        # settled_tags[t] is 1 once delivery tag t (1-based) is acked or nacked.
        self.settled_tags = bytearray(self.total + 1)
        self.floor = 1  # every tag below this is settled
        self.started = 0.0
        self.finished = 0.0
        self.error: str | None = None
        self.meter = CpuMeter()
        self.cpu: CpuSplit | None = None
        self.conn: Any = None
        self.channel: Any = None

    def run(self) -> CeilingResult:
        self.conn = SelectConnection(
            parameters=self.params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )
        self.conn.ioloop.call_later(self.timeout, self._on_timeout)
        self.conn.ioloop.start()
        if self.error is not None:
            raise CeilingError(self.error)
        seconds = self.finished - self.started
        return CeilingResult(
            self.total, seconds, self.acked, self.nacked, self.returned, self.meter.stop(seconds)
        )

    # -- connection and channel

    def _on_open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, _conn: Any, err: BaseException) -> None:
        self.error = f"cannot connect: {err!r}"
        self.conn.ioloop.stop()

    def _on_closed(self, _conn: Any, reason: BaseException) -> None:
        if self.settled < self.total and self.error is None:
            self.error = f"connection closed before the last confirm: {reason!r}"
        self.conn.ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_return_callback(self._on_return)
        channel.add_on_close_callback(self._on_channel_closed)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_ok)

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        if self.settled < self.total and self.error is None:
            self.error = f"channel closed before the last confirm: {reason!r}"
            self.conn.close()

    def _on_confirm_ok(self, _frame: Any) -> None:
        self.meter.start()
        self.started = time.perf_counter()
        self._pump()

    def _on_timeout(self) -> None:
        if self.settled < self.total:
            self.error = (
                f"timed out after {self.timeout:.0f} s: {self.settled} of {self.total} confirmed"
            )
            self.conn.close()

    # -- the measured part

    def _pump(self) -> None:
        publish = self.channel.basic_publish
        exchange, routing_key = self.exchange, self.routing_key
        bodies, properties = self.bodies, self.properties
        sent = self.sent
        limit = min(self.total, self.settled + self.window)
        while sent < limit:
            publish(exchange, routing_key, bodies[sent], properties[sent], True)
            sent += 1
        self.sent = sent

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        ack = isinstance(method, spec.Basic.Ack)
        tag: int = method.delivery_tag
        marks = self.settled_tags
        newly = 0
        if method.multiple:
            for t in range(self.floor, tag + 1):
                if not marks[t]:
                    marks[t] = 1
                    newly += 1
        elif not marks[tag]:
            marks[tag] = 1
            newly = 1
        while self.floor <= self.total and marks[self.floor]:
            self.floor += 1
        self.settled += newly
        if ack:
            self.acked += newly
        else:
            self.nacked += newly
        if self.settled >= self.total:
            self.finished = time.perf_counter()
            self.conn.close()
            return
        self._pump()

    def _on_return(self, _channel: Any, _method: Any, _properties: Any, _body: bytes) -> None:
        self.returned += 1


def measure_ceiling(
    amqp_url: str,
    exchange: str,
    routing_key: str,
    bodies: Sequence[bytes],
    properties: Sequence[Any],
    *,
    window: int = 1000,
    timeout: float = 300.0,
) -> CeilingResult:
    """Publish every body once with confirms; return the rate, first publish to last confirm."""
    if len(bodies) != len(properties) or not bodies:
        raise ValueError("need as many properties as bodies, and at least one of each")
    return _Run(amqp_url, exchange, routing_key, bodies, properties, window, timeout).run()


def measure_serial(
    amqp_url: str,
    exchange: str,
    routing_key: str,
    bodies: Sequence[bytes],
    properties: Sequence[Any],
) -> CeilingResult:
    """The same messages, each published once the one before it is confirmed (pika's
    BlockingConnection in confirm mode): the bound on one key's rate for any relay that keeps a
    key's order whatever the broker does with each message."""
    params = pika.URLParameters(amqp_url)
    params.connection_attempts = 1
    conn = pika.BlockingConnection(params)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        meter = CpuMeter()
        meter.start()
        started = time.perf_counter()
        for body, props in zip(bodies, properties, strict=True):
            channel.basic_publish(exchange, routing_key, body, props, mandatory=True)
        seconds = time.perf_counter() - started
        cpu = meter.stop(seconds)
    finally:
        conn.close()
    n = len(bodies)
    return CeilingResult(n, seconds, n, 0, 0, cpu=cpu)
