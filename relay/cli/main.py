"""`outbox-relay`: the command groups' parsers assembled, and the command dispatched.

Exit codes: 0 success, 1 runtime failure, 2 bad usage or configuration (one line, no traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn

from relay.cli import circuits, demo, messages, retention, run, schema
from relay.cli.options import Handler, accept_global_options_after, add_global_options, configure
from relay.errors import ConfigError, RelayError
from relay.runtime import logs

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

_COMMANDS: dict[str, Handler] = {
    **run.COMMANDS,
    **schema.COMMANDS,
    **messages.COMMANDS,
    **retention.COMMANDS,
    **circuits.COMMANDS,
    **demo.COMMANDS,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not a usage dump: operators read this in container logs.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    try:
        return version("outbox-relay")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox-relay",
        description="Relay transactional outbox rows to RabbitMQ with publisher confirms.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    # The order of --help's command list.
    run.add_parsers(sub)
    schema.add_parsers(sub)
    messages.add_parsers(sub)
    retention.add_parser(sub)
    circuits.add_parser(sub)
    demo.add_parsers(sub)
    accept_global_options_after(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # bad usage (one line, see _Parser), --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        config = configure(args, os.environ)
    except ConfigError as exc:
        print(f"outbox-relay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.setup(config.log_level)
    try:
        return _COMMANDS[args.command](config, args)
    except ConfigError as exc:
        print(f"outbox-relay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RelayError as exc:
        print(f"outbox-relay: {args.command} failed: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
