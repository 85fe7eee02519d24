"""`outbox-relay`: the command groups' parsers assembled, and the command dispatched.

Exit codes: 0 success (a closed output pipe included), 1 runtime failure, 2 bad usage or
configuration; each failure is one line on stderr, never a traceback (--log-level DEBUG logs it).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from relay.cli import (
    capture,
    circuits,
    console,
    demo,
    grants,
    messages,
    retention,
    run,
    schema,
    sql,
    topology,
)
from relay.cli.entry import needs, version_line
from relay.cli.options import (
    Handler,
    accept_global_options_after,
    add_global_options,
    configure,
    replaced_options,
)
from relay.core.urls import secrets_of
from relay.errors import (
    BrokerUnavailable,
    ConfigError,
    PermissionDenied,
    RelayError,
    plain_broker_error,
)
from relay.runtime import logs
from relay.runtime.logs import one_line
from relay.runtime.settings import MANY_DATABASES

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

log = logging.getLogger("relay")

_COMMANDS: dict[str, Handler] = {
    **run.COMMANDS,
    **schema.COMMANDS,
    **messages.COMMANDS,
    **retention.COMMANDS,
    **circuits.COMMANDS,
    **console.COMMANDS,
    **grants.COMMANDS,
    **demo.COMMANDS,
    **topology.COMMANDS,
    **capture.COMMANDS,
    **sql.COMMANDS,
}
# The extra a command needs beyond the relay's (relay/cli/entry.py checks that one).
_EXTRAS = {"console": "console"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not a usage dump: operators read this in container logs.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox-relay",
        description="Relay transactional outbox rows to RabbitMQ with publisher confirms.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    # The order of --help's command list.
    run.add_parsers(sub)
    schema.add_parsers(sub)
    messages.add_parsers(sub)
    retention.add_parser(sub)
    circuits.add_parser(sub)
    console.add_parser(sub)
    grants.add_parser(sub)
    topology.add_parser(sub)
    capture.add_parser(sub)
    sql.add_parser(sub)
    demo.add_parsers(sub)
    accept_global_options_after(sub)
    return parser


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the interpreter's final flush does not
    print a BrokenPipeError of its own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (captured in tests): nothing will flush to the pipe


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # bad usage (one line, see _Parser), --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    extra = _EXTRAS.get(args.command)
    problem = needs(extra, args.command) if extra else None
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_USAGE
    try:
        config = configure(args, os.environ)
    except ConfigError as exc:
        print(f"outbox-relay: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if config.many_databases and args.command not in MANY_DATABASES:
        served = ", ".join(sorted(MANY_DATABASES))
        print(
            f"outbox-relay: error: {args.command} takes one database (one --db, no --db-file); "
            f"several are for {served}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    logs.setup(config.log_level)
    for why in replaced_options(args, os.environ):
        log.warning("config.replaced", extra={"why": why})
    secrets = secrets_of(config.db_url, *config.db_urls, config.amqp_url)

    def fail(code: int, message: str) -> int:
        print(one_line(message, secrets), file=sys.stderr)
        return code

    try:
        code = _COMMANDS[args.command](config, args)
        sys.stdout.flush()  # here, so a closed pipe is seen below and not at exit
        return code
    except BrokenPipeError:
        # `outbox-relay messages | head`: the reader has what it wanted.
        _quiet_stdout()
        return EXIT_OK
    except ConfigError as exc:
        return fail(EXIT_USAGE, f"outbox-relay: error: {exc}")
    except BrokerUnavailable as exc:
        return fail(
            EXIT_FAILURE, f"outbox-relay: {args.command} failed: {plain_broker_error(str(exc))}"
        )
    except PermissionDenied as exc:  # named as the privileges the role lacks
        why = grants.explain_denied(config, args, exc)
        return fail(EXIT_FAILURE, f"outbox-relay: {args.command} failed: {why}")
    except RelayError as exc:
        return fail(EXIT_FAILURE, f"outbox-relay: {args.command} failed: {exc}")
    except KeyboardInterrupt:
        return EXIT_FAILURE
    except Exception as exc:
        # A bug, or a failure nobody translated: still one line; the traceback at DEBUG.
        log.debug("command.failed", exc_info=True)
        return fail(
            EXIT_FAILURE,
            f"outbox-relay: {args.command} failed unexpectedly: {type(exc).__name__}: {exc} "
            "(--log-level DEBUG logs the traceback)",
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
