"""Commit-to-consumer latency at 100 msg/s after an idle spell, beside RabbitMQ's own floor.

Measured end to end, as a user of the messages sees it: a real consumer records when each message
arrives; the latency is that moment minus the producer's time right after its commit returned. The
floor is RabbitMQ alone in the same run: the same message published with confirms (persistent,
mandatory) to the same exchange, queue and consumer, timed from just before the publish. Runs
alternate floor and relay (three of each by default) so that the machine's load, which may change by
the second, weighs on both alike.

The producer and the consumer are threads of this process, so both read one clock
(time.perf_counter); the relay is `outbox-relay run` with its defaults, as operators run it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika
from sqlalchemy import Engine

import outbox

Row = tuple[str, str, str]
PERSISTENT = pika.BasicProperties(delivery_mode=2, content_type="application/json")


@dataclass
class Consumer:
    """A pika consumer in a thread of its own; `arrived[tag]` is when each message came in."""

    amqp_url: str
    queue: str
    arrived: dict[str, float] = field(default_factory=dict)
    _conn: Any = None
    _channel: Any = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-consumer", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the benchmark's consumer did not start")

    def _run(self) -> None:
        self._conn = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
        channel = self._channel = self._conn.channel()
        channel.basic_qos(prefetch_count=1000)

        def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
            at = time.perf_counter()  # first thing: everything after is not latency
            ch.basic_ack(method.delivery_tag)
            self.arrived[json.loads(body)["t"]] = at

        channel.basic_consume(self.queue, on_message)
        self._ready.set()
        channel.start_consuming()
        self._conn.close()

    def stop(self) -> None:
        conn, channel = self._conn, self._channel
        if conn is not None and channel is not None and self._thread is not None:
            conn.add_callback_threadsafe(channel.stop_consuming)  # then _run closes conn
            self._thread.join(10)

    def wait_for(self, tags: Sequence[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(t not in self.arrived for t in tags):
            if time.monotonic() > deadline:
                missing = sum(t not in self.arrived for t in tags)
                raise RuntimeError(f"{missing} of {len(tags)} messages never reached the consumer")
            time.sleep(0.01)


def _paced(count: int, rate: float, send: Callable[[int], float]) -> list[float]:
    """Call `send(n)` at a steady `rate`; each returns its start time (commit or publish)."""
    start = time.perf_counter()
    sent: list[float] = []
    for n in range(count):
        pause = start + n / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        sent.append(send(n))
    return sent


def broker_floor(
    amqp_url: str, exchange: str, consumer: Consumer, run: str, count: int, rate: float, idle: float
) -> list[float]:
    """ms from just before a confirmed publish to the consumer's receipt, per message."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        time.sleep(idle)  # the same idle spell the relay gets
        tags = [f"{run}-{n}" for n in range(count)]

        def send(n: int) -> float:
            at = time.perf_counter()
            body = json.dumps({"t": tags[n]}).encode()
            channel.basic_publish(exchange, "r", body, PERSISTENT, mandatory=True)
            return at

        sent = _paced(count, rate, send)
    finally:
        conn.close()
    consumer.wait_for(tags, 30)
    return [(consumer.arrived[t] - s) * 1000 for t, s in zip(tags, sent, strict=True)]


def relay_latency(
    engine: Engine,
    start_relay: Callable[[], subprocess.Popen[bytes]],
    exchange: str,
    consumer: Consumer,
    run: str,
    count: int,
    rate: float,
    idle: float,
) -> list[float]:
    """ms from just after the producer's commit returned to the consumer's receipt."""
    relay = start_relay()
    try:
        with engine.connect() as conn:

            def commit(tag: str) -> float:
                with conn.begin():
                    outbox.enqueue(conn, exchange=exchange, routing_key="r", payload={"t": tag})
                return time.perf_counter()

            # Started, connected and relaying: then idle, as a quiet service's relay is.
            commit(f"{run}-warm")
            consumer.wait_for([f"{run}-warm"], 60)
            time.sleep(idle)
            tags = [f"{run}-{n}" for n in range(count)]
            sent = _paced(count, rate, lambda n: commit(tags[n]))
        consumer.wait_for(tags, 60)
    finally:
        relay.terminate()
        relay.wait(60)
    return [(consumer.arrived[t] - s) * 1000 for t, s in zip(tags, sent, strict=True)]


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}"


@dataclass(frozen=True, slots=True)
class Samples:
    """ms per message: the broker's floor and each relay variant's, every run pooled; a row per
    run (its p50 and p99 beside the floor's of the same run)."""

    floor: list[float]
    relayed: dict[str, list[float]]
    runs: list[Row]


def consumer_samples(
    engine: Engine,
    amqp_url: str,
    exchange: str,
    queue: str,
    relays: dict[str, Callable[[], subprocess.Popen[bytes]]],
    *,
    runs: int = 3,
    seconds: float = 5.0,
    rate: float = 100.0,
    idle: float = 3.0,
) -> Samples:
    """Alternate the floor and each relay variant `runs` times, every one on `exchange`, whose
    key "r" must route to `queue`."""
    count = int(rate * seconds)
    consumer = Consumer(amqp_url, queue)
    consumer.start()
    floor: list[float] = []
    relayed: dict[str, list[float]] = {name: [] for name in relays}
    rows: list[Row] = []
    try:
        for i in range(runs):
            run = uuid.uuid4().hex[:8]
            f = broker_floor(amqp_url, exchange, consumer, f"f{run}", count, rate, idle)
            floor += f
            f50, f99 = percentiles(f)
            for n, (name, start) in enumerate(relays.items()):
                tag = f"r{n}{run}"
                r = relay_latency(engine, start, exchange, consumer, tag, count, rate, idle)
                relayed[name] += r
                r50, r99 = percentiles(r)
                rows.append(
                    (
                        f"  run {i + 1}: {name} / floor",
                        f"p50 {r50:.1f} / {f50:.1f}, p99 {r99:.1f} / {f99:.1f} ms",
                        _load(),
                    )
                )
    finally:
        consumer.stop()
    return Samples(floor, relayed, rows)


def consumer_latency(
    engine: Engine,
    amqp_url: str,
    exchange: str,
    queue: str,
    relays: dict[str, Callable[[], subprocess.Popen[bytes]]],
    *,
    runs: int = 3,
    seconds: float = 5.0,
    rate: float = 100.0,
    idle: float = 3.0,
) -> list[Row]:
    """Alternate the floor and each relay variant `runs` times; a row per variant for all its
    samples pooled, and one per run."""
    found = consumer_samples(
        engine, amqp_url, exchange, queue, relays, runs=runs, seconds=seconds, rate=rate, idle=idle
    )
    count = int(rate * seconds)
    f50, f99 = percentiles(found.floor)
    summary: list[Row] = [
        (
            f"RabbitMQ floor at {rate:.0f} msg/s (confirmed publish to the consumer)",
            f"p50 {f50:.2f} ms, p99 {f99:.2f} ms",
            f"{runs} runs of {count}",
        )
    ]
    for name, values in found.relayed.items():
        r50, r99 = percentiles(values)
        summary.append(
            (
                f"commit-to-consumer at {rate:.0f} msg/s after {idle:g} s idle ({name})",
                f"p50 {r50:.2f} ms, p99 {r99:.2f} ms",
                f"floor +{r50 - f50:.2f} / +{r99 - f99:.2f} ms (target +1 / +4)",
            )
        )
    return summary + found.runs
