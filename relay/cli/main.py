"""`outbox-relay`: the command line. Exit codes: 0 success, 1 runtime failure, 2 bad usage."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from relay.core.circuit import CircuitSettings
from relay.core.durations import positive_duration_arg
from relay.core.failures import FailureClass
from relay.core.policy import RetryPolicy
from relay.errors import ConfigError, RelayError
from relay.loop.maintenance import RetentionPolicy
from relay.runtime.config import DEFAULT_AMQP_URL, DEFAULT_DB_URL, RelayConfig, default_relay_id

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not a usage dump: operators read this in container logs.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be positive")
    return value


def _non_negative_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must not be negative")
    return value


def _positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be positive")
    return value


_duration = positive_duration_arg


def _age(raw: str) -> float | None:
    return None if raw.strip().lower() == "forever" else _duration(raw)


def _exchange_limit(raw: str) -> tuple[str, int]:
    name, sep, number = raw.rpartition("=")
    if not sep or not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not EXCHANGE=N with N >= 1")
    return name, int(number)


def _port(raw: str) -> int:
    if not raw.isdigit() or int(raw) > 65535:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port number (0 to 65535)")
    return int(raw)


def _rate_limit(raw: str) -> tuple[str, float]:
    name, sep, number = raw.rpartition("=")
    try:
        rate = float(number)
    except ValueError:
        rate = 0.0
    if not sep or not rate > 0:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not RESOURCE=RATE with RATE > 0 messages per second"
        )
    return name, rate


def _rate_limits(raw: str) -> list[tuple[str, float]]:
    return [_rate_limit(item.strip()) for item in raw.split(",") if item.strip()]


def _failure_classes(raw: str) -> frozenset[FailureClass]:
    if raw.strip().lower() == "none":
        return frozenset()
    names = [n.strip() for n in raw.split(",") if n.strip()]
    known = {c.value: c for c in FailureClass}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown failure class {', '.join(unknown)} (known: {', '.join(known)})"
        )
    return frozenset(known[n] for n in names)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox-relay",
        description="Relay transactional outbox rows to RabbitMQ with publisher confirms.",
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("OUTBOX_DB_URL", DEFAULT_DB_URL),
        help="SQLAlchemy database URL (env OUTBOX_DB_URL; default %(default)s)",
    )
    parser.add_argument(
        "--amqp",
        default=os.environ.get("OUTBOX_AMQP_URL", DEFAULT_AMQP_URL),
        help="AMQP URL of the broker (env OUTBOX_AMQP_URL; default %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("OUTBOX_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"],
        help="log level (env OUTBOX_LOG_LEVEL; default %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    sub.add_parser("migrate", help="create or upgrade the outbox schema, then exit")

    run = sub.add_parser("run", help="relay until SIGTERM/SIGINT, then drain and exit 0")
    env = os.environ.get
    run.add_argument(
        "--relay-id",
        default=env("OUTBOX_RELAY_ID") or default_relay_id(),
        help="name of this relay in leases and logs (env OUTBOX_RELAY_ID)",
    )
    run.add_argument(
        "--batch-size",
        type=_positive_int,
        default=int(env("OUTBOX_BATCH_SIZE", "500")),
        help="rows claimed at a time (env OUTBOX_BATCH_SIZE; default %(default)s)",
    )
    run.add_argument(
        "--max-in-flight",
        type=_positive_int,
        default=int(env("OUTBOX_MAX_IN_FLIGHT", "5000")),
        help="unconfirmed messages at most (env OUTBOX_MAX_IN_FLIGHT)",
    )
    run.add_argument(
        "--poll-interval",
        type=_positive_float,
        default=float(env("OUTBOX_POLL_INTERVAL", "0.5")),
        help="longest wait between claims when idle; right after work the relay looks again "
        "within milliseconds (env OUTBOX_POLL_INTERVAL; default 0.5)",
    )
    run.add_argument(
        "--listen",
        action=argparse.BooleanOptionalAction,
        default=env("OUTBOX_LISTEN", "1").lower() not in ("0", "false", "no"),
        help="on PostgreSQL, LISTEN for enqueue notifications to wake at once (env "
        "OUTBOX_LISTEN; default on; polling continues either way, e.g. behind pgbouncer)",
    )
    run.add_argument(
        "--lease",
        type=_positive_float,
        default=float(env("OUTBOX_LEASE_SECONDS", "30")),
        help="seconds a claim is held before others may take it over",
    )
    run.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=int(env("OUTBOX_MAX_ATTEMPTS", "10")),
        help="attempts before a message is dead-lettered, unless it sets its own "
        "(env OUTBOX_MAX_ATTEMPTS; default %(default)s)",
    )
    run.add_argument(
        "--max-attempts-for",
        action="append",
        default=[],
        type=_exchange_limit,
        metavar="EXCHANGE=N",
        help="max attempts for one exchange (repeatable)",
    )
    run.add_argument(
        "--max-age",
        type=_duration,
        default=_duration(env("OUTBOX_MAX_AGE", "7d")),
        help="dead-letter a failing message this old (env OUTBOX_MAX_AGE; default 7d)",
    )
    run.add_argument(
        "--backoff-base",
        type=_duration,
        default=_duration(env("OUTBOX_BACKOFF_BASE", "1s")),
        help="first backoff window (env OUTBOX_BACKOFF_BASE; default 1s)",
    )
    run.add_argument(
        "--backoff-cap",
        type=_duration,
        default=_duration(env("OUTBOX_BACKOFF_CAP", "1h")),
        help="longest backoff window (env OUTBOX_BACKOFF_CAP; default 1h)",
    )
    run.add_argument(
        "--permanent",
        type=_failure_classes,
        default=_failure_classes(env("OUTBOX_PERMANENT", "unroutable,malformed")),
        help="failure classes dead-lettered at once, comma-separated, or 'none' "
        "(env OUTBOX_PERMANENT; malformed rows are dead whatever this says)",
    )
    run.add_argument(
        "--retain-published",
        type=_age,
        default=_age(env("OUTBOX_RETAIN_PUBLISHED", "3d")),
        metavar="DURATION",
        help="delete published messages this long after publishing, or 'forever' "
        "(env OUTBOX_RETAIN_PUBLISHED; default 3d)",
    )
    run.add_argument(
        "--retain-failed",
        type=_age,
        default=_age(env("OUTBOX_RETAIN_FAILED", "30d")),
        metavar="DURATION",
        help="delete dead, discarded and cancelled messages this old, or 'forever' "
        "(env OUTBOX_RETAIN_FAILED; default 30d)",
    )
    run.add_argument(
        "--dead-key",
        choices=["hold", "skip"],
        default=env("OUTBOX_DEAD_KEY", "hold"),
        help="when a keyed message is dead-lettered, hold the rest of its key until an operator "
        "replays or discards it, or skip past it (env OUTBOX_DEAD_KEY; default hold)",
    )
    run.add_argument(
        "--circuit-threshold",
        type=_positive_int,
        default=int(env("OUTBOX_CIRCUIT_THRESHOLD", "5")),
        help="consecutive failures of one resource that open its circuit "
        "(env OUTBOX_CIRCUIT_THRESHOLD; default %(default)s)",
    )
    run.add_argument(
        "--circuit-cooldown",
        type=_duration,
        default=_duration(env("OUTBOX_CIRCUIT_COOLDOWN", "5s")),
        metavar="DURATION",
        help="first open period; it doubles while the resource keeps failing "
        "(env OUTBOX_CIRCUIT_COOLDOWN; default 5s)",
    )
    run.add_argument(
        "--circuit-max-cooldown",
        type=_duration,
        default=_duration(env("OUTBOX_CIRCUIT_MAX_COOLDOWN", "5m")),
        metavar="DURATION",
        help="longest open period (env OUTBOX_CIRCUIT_MAX_COOLDOWN; default 5m)",
    )
    run.add_argument(
        "--circuit-scope",
        choices=["broker", "exchange", "routing_key"],
        default=env("OUTBOX_CIRCUIT_SCOPE", "exchange"),
        help="what fails together and shares a circuit: the broker (and vhost), each exchange, "
        "or each exchange and routing key; the same on every relay "
        "(env OUTBOX_CIRCUIT_SCOPE; default exchange)",
    )
    run.add_argument(
        "--rate-limit",
        action="extend",
        type=_rate_limits,
        default=_rate_limits(env("OUTBOX_RATE_LIMITS", "")),
        metavar="RESOURCE=RATE",
        help="messages per second for one resource (its exchange at the default scope), shared "
        "by every relay; repeatable (env OUTBOX_RATE_LIMITS, comma-separated)",
    )
    run.add_argument(
        "--http-port",
        type=_port,
        default=_port(env("OUTBOX_HTTP_PORT", "0")),
        help="serve /healthz, /readyz and /metrics on this port; 0 turns it off "
        "(env OUTBOX_HTTP_PORT; default 0)",
    )
    run.add_argument(
        "--http-host",
        default=env("OUTBOX_HTTP_HOST", "0.0.0.0"),  # noqa: S104 - probes come from outside
        help="address for --http-port (env OUTBOX_HTTP_HOST; default 0.0.0.0)",
    )
    run.add_argument(
        "--confirm-timeout",
        type=_positive_float,
        default=float(env("OUTBOX_CONFIRM_TIMEOUT", "20")),
        help="seconds to wait for a broker confirm",
    )
    run.add_argument(
        "--drain-timeout",
        type=_non_negative_float,
        default=float(env("OUTBOX_DRAIN_TIMEOUT", "20")),
        help="seconds to wait for in-flight confirms on shutdown",
    )

    status = sub.add_parser("status", help="counts by state and the age of the oldest ready one")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    from relay.cli import messages as ops

    ops.add_parsers(sub)
    from relay.cli import circuits as circuits_cli
    from relay.cli import retention as retention_cli

    retention_cli.add_parser(sub)
    circuits_cli.add_parser(sub)

    demo = sub.add_parser("demo", help="the embedded demonstration: SQLite, local RabbitMQ")
    demo.add_argument("--orders", type=_positive_int, default=300, help="orders to write")
    demo.add_argument(
        "--rollback-every",
        type=_positive_int,
        default=7,
        help="roll back every Nth order's transaction",
    )
    demo.add_argument(
        "--timeout",
        type=_positive_float,
        default=60.0,
        help="seconds to wait for every message to arrive",
    )
    producer = sub.add_parser(
        "demo-producer", help="write demo orders with their outbox rows (docker-compose demo)"
    )
    producer.add_argument("--orders", type=int, default=0, help="orders to write; 0: until stopped")
    producer.add_argument("--rate", type=_positive_float, default=2.0, help="orders per second")
    consumer = sub.add_parser("demo-consumer", help="consume the demo orders (outbox.Consumer)")
    for p in (producer, consumer):
        p.add_argument("--exchange", default="outbox-demo", help="default %(default)s")
        p.add_argument("--queue", default="outbox-demo.orders", help="default %(default)s")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except (ValueError, argparse.ArgumentTypeError) as exc:  # a bad OUTBOX_* variable
        print(f"outbox-relay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from relay.runtime import logs

    logs.setup(args.log_level)
    handler = _COMMANDS[args.command]
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"outbox-relay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RelayError as exc:
        print(f"outbox-relay: {args.command} failed: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_FAILURE


def _config(args: argparse.Namespace) -> RelayConfig:
    kwargs: dict[str, object] = {"db_url": args.db, "amqp_url": args.amqp}
    if args.command == "run":
        kwargs.update(
            relay_id=args.relay_id,
            batch_size=args.batch_size,
            max_in_flight=args.max_in_flight,
            poll_interval=args.poll_interval,
            lease_seconds=args.lease,
            policy=RetryPolicy(
                base=args.backoff_base,
                cap=args.backoff_cap,
                floor=min(0.5, args.backoff_base),
                max_attempts=args.max_attempts,
                max_attempts_by_exchange=dict(args.max_attempts_for),
                max_age=args.max_age,
                permanent=args.permanent,
            ),
            confirm_timeout=args.confirm_timeout,
            drain_timeout=args.drain_timeout,
            dead_key=args.dead_key,
            retention=RetentionPolicy(
                published_after=args.retain_published, failed_after=args.retain_failed
            ),
            listen=args.listen,
            circuit=CircuitSettings(
                threshold=args.circuit_threshold,
                cooldown=args.circuit_cooldown,
                max_cooldown=args.circuit_max_cooldown,
                # Longer than a confirm can take, so a probe in flight is never taken over.
                probe_timeout=max(60.0, 2 * args.confirm_timeout),
            ),
            circuit_scope=args.circuit_scope,
            rate_limits=dict(args.rate_limit),
            http_port=args.http_port,
            http_host=args.http_host,
        )
    return RelayConfig(**kwargs)  # type: ignore[arg-type]


def _migrate(args: argparse.Namespace) -> int:
    from relay.cli.schema import migrate

    return migrate(_config(args))


def _run(args: argparse.Namespace) -> int:
    from relay.runtime.runner import run_relay

    return run_relay(_config(args))


def _status(args: argparse.Namespace) -> int:
    from relay.cli.circuits import format_circuits, not_closed
    from relay.cli.messages import per_exchange, table
    from relay.cli.schema import status

    config = _config(args)
    report = status(config)
    exchanges = per_exchange(config)
    circuits = not_closed(config)
    if args.json:
        print(json.dumps({**report, "exchanges": exchanges, "open_circuits": circuits}))
        return EXIT_OK
    print(format_status(report))
    if circuits:
        print(f"\n{len(circuits)} circuit(s) not closed: their messages wait, burning no attempts")
        print(format_circuits(circuits))
    if exchanges:
        print()
        rows = [
            [e["exchange"] or "(default)", str(e["pending"]), str(e["in_flight"]),
             str(e["published"]), str(e["dead"]), str(e["cancelled"]), str(e["discarded"]),
             "-" if e["oldest_ready_age_s"] is None else f"{e['oldest_ready_age_s']:.1f} s"]
            for e in exchanges
        ]  # fmt: skip
        header = ["exchange", "pending", "in_flight", "published", "dead", "cancelled",
                  "discarded", "oldest ready"]  # fmt: skip
        print(table(rows, header))
    return EXIT_OK


def format_status(report: dict[str, float | int | None]) -> str:
    rows = [
        ("pending", f"{report['pending']} ({report['ready']} ready, {report['delayed']} delayed)"),
        ("in_flight", str(report["in_flight"])),
        ("published", str(report["published"])),
        ("dead", str(report["dead"])),
        ("cancelled", str(report["cancelled"])),
        ("discarded", str(report["discarded"])),
    ]
    age = report["oldest_pending_age_s"]
    rows.append(("oldest ready age", "-" if age is None else f"{age:.1f} s"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _demo(args: argparse.Namespace) -> int:
    from relay.demo.embedded import run_demo
    from relay.runtime.config import parse_amqp_url

    parse_amqp_url(args.amqp)
    return run_demo(
        args.amqp, orders=args.orders, rollback_every=args.rollback_every, timeout=args.timeout
    )


def _demo_producer(args: argparse.Namespace) -> int:
    from relay.demo.services import run_producer

    config = _config(args)  # validates --db and --amqp
    return run_producer(
        config.db_url,
        config.amqp_url,
        orders=args.orders,
        rate=args.rate,
        exchange=args.exchange,
        queue=args.queue,
    )


def _demo_consumer(args: argparse.Namespace) -> int:
    from relay.demo.services import run_consumer

    config = _config(args)
    return run_consumer(config.db_url, config.amqp_url, exchange=args.exchange, queue=args.queue)


def _purge(args: argparse.Namespace) -> int:
    from relay.cli.retention import cmd_purge

    return cmd_purge(_config(args), args)


def _circuits(args: argparse.Namespace) -> int:
    from relay.cli.circuits import cmd_circuits

    return cmd_circuits(_config(args), args)


def _operator(args: argparse.Namespace) -> int:
    from relay.cli.messages import COMMANDS

    return COMMANDS[args.command](_config(args), args)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "migrate": _migrate,
    "run": _run,
    "status": _status,
    "demo": _demo,
    "messages": _operator,
    "show": _operator,
    "replay": _operator,
    "discard": _operator,
    "cancel": _operator,
    "purge": _purge,
    "circuits": _circuits,
    "demo-producer": _demo_producer,
    "demo-consumer": _demo_consumer,
}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
