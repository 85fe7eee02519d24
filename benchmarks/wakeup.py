"""How soon a relay sees a message it was not waiting for: commit-to-confirm of single messages
committed at random moments into an idle relay, and of a steady 100 msg/s, with the relay's
default polling and no LISTEN (what MySQL and MariaDB have; on PostgreSQL LISTEN ends the wait).

Measured in the database on one clock: `published_at` (written after the broker's confirm) minus
`created_at` (the INSERT), so each figure is an upper bound on commit-to-confirm.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass

from sqlalchemy import select

import outbox
from benchmarks.fixtures import BenchDatabase
from outbox.schema import message
from relay.amqp.publisher import Publisher
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.store.sql_store import open_store


@dataclass(frozen=True, slots=True)
class Latency:
    what: str
    p50_ms: float
    p99_ms: float
    count: int

    def describe(self) -> str:
        return f"{self.what}: p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms ({self.count})"


def _percentiles(what: str, seconds: list[float]) -> Latency:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return Latency(what, statistics.median(ms), p99, len(ms))


def measure_wakeup(
    db: BenchDatabase, amqp_url: str, exchange: str, *, idle_messages: int = 40, seed: int = 7
) -> list[Latency]:
    """Idle: `idle_messages` single commits 0.2-1.0 s apart. Steady: 100 msg/s for 5 s."""
    assert db.engine is not None
    db.empty()
    config = RelayConfig(db_url=db.url, amqp_url=amqp_url, relay_id="bench-wakeup", listen=False)
    store = open_store(config.db_url)
    publisher = Publisher(config.amqp_url, confirm_timeout=config.confirm_timeout, name="wakeup")
    publisher.start()
    relay = wire_relay(store, publisher, config)
    thread = threading.Thread(target=relay.run, name="relay-loop", daemon=True)
    thread.start()
    rng = random.Random(seed)

    def commit_one() -> None:
        assert db.engine is not None
        with db.engine.begin() as conn:
            outbox.enqueue(conn, exchange=exchange, routing_key="bench.wakeup", payload={"n": 1})

    def latencies() -> list[float]:
        assert db.engine is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with db.engine.connect() as conn:
                rows = conn.execute(select(message.c.created_at, message.c.published_at)).all()
            if rows and all(p is not None for _, p in rows):
                return [(p - c).total_seconds() for c, p in rows]
            time.sleep(0.1)
        raise RuntimeError("wakeup: messages still unpublished after 30 s")

    try:
        time.sleep(2.0)  # the relay settles into its idle polling
        for _ in range(idle_messages):
            commit_one()
            time.sleep(rng.uniform(0.2, 1.0))
        idle = _percentiles("one message into an idle relay", latencies())
        db.empty()
        next_at = time.monotonic()
        for _ in range(500):
            next_at += 0.01
            time.sleep(max(0.0, next_at - time.monotonic()))
            commit_one()
        steady = _percentiles("a steady 100 msg/s", latencies())
    finally:
        relay.request_stop()
        thread.join(30)
        store.close()
    return [idle, steady]
