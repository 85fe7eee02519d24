"""`outbox-relay demo` (everything in one process, ends by itself) and the docker-compose demo's
services, `demo-producer` and `demo-consumer`. The demo itself is relay/demo/."""

from __future__ import annotations

import argparse
from typing import Any

from relay.cli.options import Commands, Handler, argparse_type
from relay.runtime.config import RelayConfig
from relay.runtime.readers import positive_int, positive_number


def add_parsers(sub: Commands) -> None:
    count, rate = argparse_type(positive_int), argparse_type(positive_number)
    demo = sub.add_parser("demo", help="the embedded demonstration: SQLite, local RabbitMQ")
    demo.add_argument("--orders", type=count, default=300, help="orders to write")
    demo.add_argument("--rollback-every", type=count, default=7,
                      help="roll back every Nth order's transaction")  # fmt: skip
    demo.add_argument("--timeout", type=rate, default=60.0,
                      help="seconds to wait for every message to arrive")  # fmt: skip
    producer = sub.add_parser(
        "demo-producer", help="write demo orders with their outbox rows (docker-compose demo)"
    )
    producer.add_argument("--orders", type=argparse_type(non_negative_int), default=0,
                          help="orders to write; 0: until stopped")  # fmt: skip
    producer.add_argument("--rate", type=rate, default=2.0, help="orders per second")
    consumer = sub.add_parser("demo-consumer", help="consume the demo orders (outbox.Consumer)")
    for p in (producer, consumer):
        # None: the demo's own names (relay/demo/services.py), which the producer and the
        # consumer share.
        p.add_argument("--exchange", help="exchange to declare and publish to")
        p.add_argument("--queue", help="queue bound to it")


def non_negative_int(raw: str) -> int:
    return 0 if raw.strip() == "0" else positive_int(raw)


def _names(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("exchange", "queue") if getattr(args, k) is not None}


# The demo modules load pika and the relay's runtime: imported by the commands that run them.


def cmd_demo(config: RelayConfig, args: argparse.Namespace) -> int:
    from relay.demo.embedded import run_demo

    return run_demo(
        config.amqp_url, orders=args.orders, rollback_every=args.rollback_every,
        timeout=args.timeout, tls=config.amqp_tls,
    )  # fmt: skip


def cmd_demo_producer(config: RelayConfig, args: argparse.Namespace) -> int:
    from relay.demo.services import run_producer

    return run_producer(
        config.db_url, config.amqp_url, orders=args.orders, rate=args.rate,
        tls=config.amqp_tls, **_names(args),
    )  # fmt: skip


def cmd_demo_consumer(config: RelayConfig, args: argparse.Namespace) -> int:
    from relay.demo.services import run_consumer

    return run_consumer(config.db_url, config.amqp_url, tls=config.amqp_tls, **_names(args))


COMMANDS: dict[str, Handler] = {
    "demo": cmd_demo,
    "demo-producer": cmd_demo_producer,
    "demo-consumer": cmd_demo_consumer,
}
