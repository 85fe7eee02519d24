"""The broker's bound, varied: the raw pika ceiling at each window of targets.WINDOWS, from which
the report finds K (the window the broker needs for its full speed), and the ceiling and the
relay's drain on 80-byte bodies, where the relay's own cost per message weighs most, beside the
floor relay's (benchmarks/floor.py) on PostgreSQL: the bound of the design at the same window."""

from __future__ import annotations

import argparse
import uuid

from benchmarks.ceiling import CeilingResult, measure_ceiling
from benchmarks.drain import drain_in_process
from benchmarks.fixtures import (
    ROUTING_KEY,
    BenchBroker,
    BenchDatabase,
    encode,
    make_payload,
    message_properties,
)
from benchmarks.floor import drain_floor
from benchmarks.results import Results, add, add_drain, fmt_rate, say, settle
from benchmarks.targets import WINDOWS
from relay.runtime.config import RelayConfig

WINDOW_MESSAGES = 20_000  # messages per window, at most (--messages when smaller)
SMALL_BYTES = 80


def ceiling(
    args: argparse.Namespace,
    broker: BenchBroker,
    bodies: list[bytes],
    now: float,
    window: int,
    results: Results,
    key: str,
) -> None:
    """One raw pika ceiling run, its rate and CPU split recorded under `key`."""
    props = [message_properties(uuid.uuid4(), now) for _ in bodies]
    c: CeilingResult = broker.purged(
        lambda: measure_ceiling(
            args.amqp, broker.exchange, ROUTING_KEY, bodies, props,
            window=window, timeout=args.timeout,
        ),
        len(bodies),
        key,
    )  # fmt: skip
    if c.nacked or c.returned:
        raise RuntimeError(f"{key}: {c.nacked} nacked, {c.returned} returned")
    row = add(results, key, c.rate)
    extra = f"{c.seconds:.2f} s" + (f"; {c.cpu.describe(c.messages)}" if c.cpu else "")
    row.extras.append(extra)
    if c.cpu is not None:
        row.others.append(c.cpu.cores("other"))
        if c.messages:  # the publishing process's CPU per message: what the relay's is held to
            row.relay_us.append(c.cpu.used.get("relay", 0.0) / c.messages * 1e6)
    say(f"  {fmt_rate(c.rate)} ({extra})")


def window_need(
    tag: str,
    args: argparse.Namespace,
    broker: BenchBroker,
    payloads: list[bytes],
    now: float,
    results: Results,
) -> None:
    """The raw pika ceiling at each window, on the run's own bodies."""
    bodies = payloads[:WINDOW_MESSAGES]
    for window in WINDOWS:
        settle()
        say(f"ceiling at window {window}, {len(bodies)} messages{tag} ...")
        ceiling(args, broker, bodies, now, window, results, f"window-{window}")


def small(
    tag: str,
    args: argparse.Namespace,
    db: BenchDatabase,
    broker: BenchBroker,
    now: float,
    results: Results,
) -> None:
    """The ceiling on 80-byte bodies, then the relay draining `db`'s backlog of them
    (in-process, default settings), then on PostgreSQL the floor relay draining it again."""
    bodies = [encode(make_payload(i, SMALL_BYTES)) for i in range(db.loaded)]
    settle()
    say(f"ceiling, {SMALL_BYTES}-byte bodies, window {args.window}{tag} ...")
    ceiling(args, broker, bodies, now, args.window, results, "small-ceiling")
    db.restore()
    settle()
    say(f"relay drain, in-process, {SMALL_BYTES}-byte bodies{tag} ...")
    drained = broker.purged(
        lambda: drain_in_process(db, args.amqp, timeout=args.timeout), db.restored, "small"
    )
    add_drain(results, "small", drained)
    if db.mysql:
        return  # the floor relay is psycopg's
    db.restore()
    settle()
    defaults = RelayConfig()
    window = defaults.max_in_flight  # the window's ceiling
    say(f"floor relay, {SMALL_BYTES}-byte bodies, window {window}{tag} ...")
    floor = broker.purged(
        lambda: drain_floor(
            db.url, args.amqp, db.restored,
            claim=defaults.claim_max, window=window, timeout=args.timeout,
        ),
        db.restored,
        "small-floor",
    )  # fmt: skip
    add_drain(results, "small-floor", floor)
