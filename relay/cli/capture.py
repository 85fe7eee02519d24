"""`outbox-relay capture`: what `run --capture logical` reads, on PostgreSQL (relay/capture/).

    outbox-relay capture setup    create the slot and publication (idempotent); exit 2 listing,
                                  one line each, what the server or role lacks
    outbox-relay capture status   the slot: active or not, its lag in bytes and messages,
                                  wal_status [--json]
    outbox-relay capture drop     remove them (refused while a relay reads the slot)

The slot and the publication share one name, --capture-slot (default outbox_relay).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from relay.cli.messages import operator_engine
from relay.cli.options import Commands, Handler, add_command_options
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig


def add_parser(sub: Commands) -> None:
    p = sub.add_parser(
        "capture",
        help="setup, status or drop: the replication slot `run --capture logical` reads",
    )
    add_command_options(p, "capture")
    actions = p.add_subparsers(dest="capture_action", metavar="ACTION")
    actions.required = True
    actions.add_parser("setup", help="create the slot and publication (idempotent)")
    status = actions.add_parser(
        "status", help="the slot's state, lag in bytes and messages, and wal_status"
    )
    status.add_argument("--json", action="store_true", help="one JSON object")
    actions.add_parser("drop", help="remove the slot and publication")


def cmd_capture(config: RelayConfig, args: argparse.Namespace) -> int:
    # Here, not at the top: psycopg, which only PostgreSQL's users install.
    from relay.capture import admin

    slot = config.capture_slot
    with operator_engine(config) as engine:
        if engine.dialect.name != "postgresql":
            raise ConfigError(
                f"capture: logical capture needs PostgreSQL, not {engine.dialect.name}"
            )
        if args.capture_action == "setup":
            lacking = admin.problems(engine, slot=slot)
            if lacking:
                for problem in lacking:
                    print(f"outbox-relay: error: {problem.detail}", file=sys.stderr)
                return 2
            for line in admin.setup(engine, slot=slot, publication=slot):
                print(line)
            return 0
        if args.capture_action == "drop":
            for line in admin.drop(engine, slot=slot, publication=slot):
                print(line)
            # A running application checked the slot once, at its first message: it goes on
            # emitting into a log that nothing keeps for anyone.
            print(
                "applications enqueueing with OUTBOX_CAPTURE=logical lose what they emit from now "
                "on: switch them to table mode (and restart them) first",
                file=sys.stderr,
            )
            return 0
        state = admin.status(engine, slot=slot, publication=slot)
    if args.json:
        print(json.dumps(dataclasses.asdict(state)))
        return 0 if state.exists else 1
    if not state.exists:
        print(f"no replication slot {slot!r}: `outbox-relay capture setup` creates it")
        return 1
    print(format_status(state))
    return 0


def format_status(state: object) -> str:
    values = dataclasses.asdict(state)  # type: ignore[call-overload]
    rows = [
        ("slot", values["slot"]),
        ("active", "yes (pid {})".format(values["active_pid"]) if values["active"] else "no"),
        ("publication", "yes" if values["publication_exists"] else "missing"),
        ("confirmed up to", values["confirmed_lsn"] or "-"),
        ("lag", _size(values["lag_bytes"])),
        ("pending messages", "-" if values["pending"] is None else str(values["pending"])),
        ("wal_status", values["wal_status"] or "-"),
        ("safe_wal_size", _size(values["safe_wal_size"])),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit} ({value} bytes)"
    return f"{value} bytes"


COMMANDS: dict[str, Handler] = {"capture": cmd_capture}
