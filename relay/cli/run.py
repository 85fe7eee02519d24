"""`outbox-relay run`: the relay, until SIGTERM or SIGINT. Its flags are those of the settings
table (relay.runtime.settings.SETTINGS) that `run` reads."""

from __future__ import annotations

import argparse

from relay.cli.options import Commands, Handler, add_command_options
from relay.runtime.config import RelayConfig


def add_parsers(sub: Commands) -> None:
    run = sub.add_parser("run", help="relay until SIGTERM/SIGINT, then drain and exit 0")
    add_command_options(run, "run")


def cmd_run(config: RelayConfig, args: argparse.Namespace) -> int:
    # Here, not at the top: the runner loads pika, which no other command needs.
    from relay.runtime.runner import run_relay

    return run_relay(config)


COMMANDS: dict[str, Handler] = {"run": cmd_run}
