"""The "kill mid-drain" fault: a relay with DEFAULT settings drains a committed backlog, is killed
with SIGKILL part way through, and a new one is started at once (as a deployment would restart
it). Recovery runs from that restart until every message has arrived; the duplicates are what the
new relay published again of what the broker already had.

Unlike the other faults nothing is written during the drain: the backlog is committed first, so the
relay works at full drain speed when it is killed.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from sqlalchemy import Engine, text

import outbox
from tests.chaos.checker import DeliveryChecker
from tests.chaos.run import AMQP_URL, Consumer, Relay, Row, environment, relay_flags

NAME = "kill mid-drain"
BATCH = 1000  # messages per enqueue transaction while the backlog is written


def write_backlog(
    engine: Engine, exchange: str, checker: DeliveryChecker, *, messages: int, keyed_every: int,
    keys: int,
) -> None:  # fmt: skip
    """Commit `messages` messages; every `keyed_every`th has one of `keys` ordering keys (so the
    per-key order is checked too), the rest none (the drain runs at full speed)."""
    for start in range(0, messages, BATCH):
        written: list[tuple[str, str | None]] = []
        with engine.begin() as conn:
            for n in range(start, min(messages, start + BATCH)):
                key = f"k{n % keys}" if keyed_every and n % keyed_every == 0 else None
                message_id = outbox.enqueue(
                    conn, exchange=exchange, routing_key="chaos", payload={"n": n}, key=key
                )
                written.append((str(message_id), key))
        for committed, key in written:  # committed, in commit order
            checker.committed(committed, key)


def in_flight(engine: Engine) -> int:
    with engine.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM outbox_message WHERE state = 'in_flight'"))
        return int(count.scalar_one())


def run_kill_mid_drain(
    *, messages: int = 20_000, kill_after: float = 0.4, keyed_every: int = 10, keys: int = 200,
    settle_timeout: float = 120.0, workdir: Path | None = None, database: str = "postgresql",
) -> Row:  # fmt: skip
    """Kill the relay once `kill_after` of the backlog has arrived; start another at once."""
    checker = DeliveryChecker()
    workdir = workdir or Path(os.environ.get("TMPDIR", "/tmp"))
    name = NAME if database == "postgresql" else f"{NAME} ({database})"
    with environment(NAME, database) as (db_url, engine, exchange, queue):
        write_backlog(
            engine, exchange, checker, messages=messages, keyed_every=keyed_every, keys=keys
        )
        log = workdir / f"chaos-kill-mid-drain-{uuid.uuid4().hex[:6]}.log"
        # Every setting at its default (with logical capture, the slot to read).
        relay = Relay(db_url, AMQP_URL, log, flags=relay_flags(db_url, database, flags=()))
        consumer = Consumer(queue, checker, auto_ack=True)
        consumer.start()
        relay.start()
        held = 0
        try:
            deadline = time.monotonic() + settle_timeout
            while checker.received_count < kill_after * messages:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: the first relay did not get going: see {log}")
                time.sleep(0.005)
            relay.kill()
            relay.start()
            restarted = time.monotonic()
            # The dead relay's leases, seen from the database (from the log: none in the table).
            held = in_flight(engine)
            deadline = restarted + settle_timeout
            while not checker.all_received() and time.monotonic() < deadline:
                time.sleep(0.01)
            recovery = time.monotonic() - restarted
            time.sleep(0.5)  # a late duplicate would show up now
        finally:
            relay.stop()
            consumer.stop()
        return Row(name, checker.report(), recovery, held_at_kill=held)


def note(row: Row) -> str:
    """What the table's columns do not say about a kill mid-drain."""
    return (
        f"{row.fault}: the backlog committed first, a relay with default settings killed "
        f"(SIGKILL) holding {row.held_at_kill} rows in flight, another started at once; "
        "recovery: from that start until every message had arrived"
    )
