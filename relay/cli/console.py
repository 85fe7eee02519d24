"""`outbox-relay console`: the operator console in a browser, until SIGTERM or SIGINT.

    outbox-relay console [--http-port 9465] [--http-host 127.0.0.1] [--open-reads] [--trace-url URL]

Reads and actions need a token, read from OUTBOX_CONSOLE_TOKEN only (a token on the command line
would show in `ps`). --open-reads lets anyone on loopback read without it; without a token the
console then only reads, and it never listens beyond loopback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from types import FrameType

from relay.cli.options import Commands, Handler, argparse_type
from relay.console.auth import is_loopback
from relay.console.throttle import MIN_BITS, token_bits
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.runtime.readers import port

log = logging.getLogger("relay")

TOKEN_VARIABLE = "OUTBOX_CONSOLE_TOKEN"  # noqa: S105 - a variable's name, not its value
DEFAULT_PORT = 9465  # beside the relay's 9464
DEFAULT_HOST = "127.0.0.1"


def trace_url(raw: str) -> str:
    """A tracing UI's URL for one trace, with {trace_id} where the id goes."""
    if not raw.startswith(("http://", "https://")) or "{trace_id}" not in raw:
        raise ValueError(
            f"{raw!r} is not an http(s) URL with {{trace_id}} in it "
            "(e.g. http://localhost:16686/trace/{trace_id})"
        )
    return raw


def add_parser(sub: Commands) -> None:
    p = sub.add_parser(
        "console",
        help="the operator console: overview, messages, replay/reschedule/... in a browser",
        description=f"Reads and actions need {TOKEN_VARIABLE} (at least {MIN_BITS} bits: "
        "python -c 'import secrets; print(secrets.token_urlsafe(32))').",
    )
    p.add_argument(
        "--http-port",
        type=argparse_type(port),
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"port to serve on; 0 picks a free one (default {DEFAULT_PORT})",
    )
    p.add_argument(
        "--http-host",
        default=DEFAULT_HOST,
        metavar="HOST",
        help=f"address to listen on (default {DEFAULT_HOST}); anything but loopback "
        f"needs {TOKEN_VARIABLE}, for reads too",
    )
    p.add_argument(
        "--open-reads",
        action="store_true",
        help="let anyone who can reach the console read it without the token (a loopback "
        "address only; every local account, and every container of a pod, shares loopback)",
    )
    p.add_argument(
        "--trace-url",
        type=argparse_type(trace_url),
        metavar="URL",
        help="link trace ids to a tracing UI: https://jaeger/trace/{trace_id}",
    )


def token_from(environ: dict[str, str]) -> str | None:
    raw = environ.get(TOKEN_VARIABLE, "").strip()
    if not raw:
        return None
    bits = token_bits(raw)
    if bits < MIN_BITS:
        raise ConfigError(
            f"{TOKEN_VARIABLE} is too weak (about {bits:.0f} bits; at least {MIN_BITS} bits "
            "needed): python -c 'import secrets; print(secrets.token_urlsafe(32))' makes one"
        )
    return raw


def cmd_console(config: RelayConfig, args: argparse.Namespace) -> int:
    token = token_from(dict(os.environ))
    host = args.http_host.strip()
    if not is_loopback(host) and (token is None or args.open_reads):
        raise ConfigError(
            f"--http-host {host} is not a loopback address: set {TOKEN_VARIABLE}, and leave out "
            "--open-reads (beyond loopback, reads need the token)"
        )
    if token is None and not args.open_reads:
        raise ConfigError(
            f"set {TOKEN_VARIABLE} (reads and actions need it), or pass --open-reads to read "
            "without it on loopback"
        )
    try:
        from relay.console.server import open_console  # the `console` extra, when installed
    except ImportError as exc:
        raise ConfigError(
            f"the console needs its web stack ({exc.name} is missing): "
            "pip install 'outbox-relay[console]'"
        ) from None
    try:
        server = open_console(
            config.db_url,
            host=host,
            port=args.http_port,
            token=token,
            trace_url=args.trace_url,
            open_reads=args.open_reads,
        )
    except OSError as exc:
        raise ConfigError(
            f"--http-port: cannot listen on {host}:{args.http_port}: {exc.strerror or exc}"
        ) from None
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    log.info(
        "console.listening",
        extra={
            "url": server.url,
            "actions": "on" if token else f"off (set {TOKEN_VARIABLE})",
            "reads": "open" if args.open_reads else "need the token",
        },
    )
    try:
        stop.wait()
    finally:
        server.stop()
    log.info("console.stopped")
    return 0


COMMANDS: dict[str, Handler] = {"console": cmd_console}
