"""The database and broker URLs, checked as the configuration reads them: a bad one is a usage
error naming --db or --amqp (and which URL of a cluster's list), never with its password."""

from __future__ import annotations

import ast
import math
import urllib.parse
from collections.abc import Callable, Mapping

from sqlalchemy.engine import URL

from relay.amqp.tls import TlsOptions
from relay.core.urls import redact, split_urls
from relay.errors import ConfigError
from relay.runtime.readers import MAX_INT, MAX_SECONDS
from relay.store.databases import database_url


def parse_db_url(raw: str) -> URL:
    """The database URL the store will open (relay.store.databases knows which); ConfigError
    naming --db otherwise."""
    try:
        return _database_url(raw)
    except ConfigError as exc:
        raise ConfigError(f"--db: {exc}") from None


def parse_amqp_url(raw: str) -> list[urllib.parse.SplitResult]:
    """Validate an AMQP URL, or a comma-separated list of them (the nodes of one cluster);
    raise ConfigError naming the problem, and which URL has it."""
    try:
        return _amqp_urls(raw)
    except ValueError as exc:
        raise ConfigError(f"--amqp: {exc}") from None


def _amqp_urls(raw: str) -> list[urllib.parse.SplitResult]:
    urls = split_urls(raw)
    if not urls:
        raise ValueError("no URL is given")
    nodes = []
    for n, url in enumerate(urls, 1):
        try:
            nodes.append(_amqp_url(url))
        except ValueError as exc:
            if len(urls) == 1:
                raise
            raise ValueError(f"URL {n} of {len(urls)}: {exc}") from None
    vhosts = {urllib.parse.unquote(p.path[1:] if p.path.startswith("/") else p.path) or "/"
              for p in nodes}  # fmt: skip
    if len(vhosts) > 1:
        # The nodes of one cluster: one vhost, so one set of circuits and destinations.
        raise ValueError(
            f"the URLs name different virtual hosts ({', '.join(sorted(map(repr, vhosts)))}); "
            "list the nodes of one cluster, with the same vhost"
        )
    return nodes


def _amqp_url(raw: str) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(
            f"{redact(raw)!r} is not an AMQP URL (expected amqp://user:pass@host:5672/vhost)"
        )
    if "," in parts.netloc.rpartition("@")[2]:
        raise ValueError(
            f"{redact(raw)!r} lists several hosts in one URL; write each node as a whole URL: "
            "amqp://user:pass@node1:5672/%2F,amqp://user:pass@node2:5672/%2F"
        )
    if not parts.hostname:
        raise ValueError(f"{redact(raw)!r} names no host")
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(f"{redact(raw)!r} has an invalid port") from None
    for name, values in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items():
        _amqp_option(name, values)
    return parts


def check_amqp_tls(urls: str, tls: TlsOptions) -> None:
    """The TLS options fit the URLs (every one amqps://, none with pika's own `ssl_options`)
    and their files make a context; ConfigError naming the option otherwise."""
    given = tls.given
    if not given:
        return
    for url in split_urls(urls):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "amqps":
            raise ConfigError(
                f"{given[0]} is for amqps:// URLs, and {redact(url)} is not one: use amqps:// "
                "(port 5671 by default) or leave the TLS options out"
            )
        if "ssl_options" in urllib.parse.parse_qs(parts.query):
            raise ConfigError(
                f"{given[0]} and the URL parameter ssl_options of {redact(url)} both set up "
                "TLS: use one of them"
            )
    try:
        tls.context()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _count(low: int, high: int | None = None) -> Callable[[str], bool]:
    top = high if high is not None else MAX_INT
    return lambda v: v.isascii() and v.isdigit() and len(v) <= 10 and low <= int(v) <= top


def _seconds_at_least(low: float, *, equal: bool) -> Callable[[str], bool]:
    def check(v: str) -> bool:
        try:
            n = float(v)
        except ValueError:
            return False
        return math.isfinite(n) and (n >= low if equal else n > low) and n <= MAX_SECONDS

    return check


def _literal(kind: type) -> Callable[[str], bool]:
    def check(v: str) -> bool:
        try:
            return isinstance(ast.literal_eval(v), kind)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return False

    return check


# The query parameters pika reads from an AMQP URL, what each accepts (pika's own ranges), and
# how to say it. pika.URLParameters checks them too, but is not asked here: its errors do not
# always name the parameter ("Min AMQP 0.9.1 Frame Size is 4096, but got 1", a bare SyntaxError
# for a dict literal), some echo the value (the URL is a secret), it takes values that fail only
# at connection time (heartbeat=70000, retry_delay=-1), and importing pika here would load it
# for commands that never talk to the broker (and only relay.amqp may import it).
_AMQP_OPTIONS: Mapping[str, tuple[Callable[[str], bool], str]] = {
    "heartbeat": (_count(0, 65535), "an integer number of seconds, 0 to 65535"),
    "channel_max": (_count(1, 65535), "an integer, 1 to 65535"),
    "frame_max": (_count(4096, 131072), "an integer, 4096 to 131072"),
    "connection_attempts": (_count(1), "a positive integer"),
    "retry_delay": (_seconds_at_least(0, equal=True), "a number of seconds, 0 or more"),
    "socket_timeout": (_seconds_at_least(0, equal=False), "a positive number of seconds"),
    "stack_timeout": (_seconds_at_least(0, equal=False), "a positive number of seconds"),
    "blocked_connection_timeout": (
        _seconds_at_least(0, equal=True),
        "a number of seconds, 0 or more",
    ),
    "locale": (bool, "a locale name"),
    "client_properties": (_literal(dict), "a Python dict literal"),
    "ssl_options": (_literal(dict), "a Python dict literal"),
    "tcp_options": (_literal(dict), "a Python dict literal"),
}


def _amqp_option(name: str, values: list[str]) -> None:
    known = _AMQP_OPTIONS.get(name)
    if known is None:
        raise ValueError(
            f"unknown URL parameter {name!r} (known: {', '.join(sorted(_AMQP_OPTIONS))})"
        )
    check, expected = known
    if len(values) != 1:
        raise ValueError(f"URL parameter {name!r} is given {len(values)} times")
    if not check(values[0]):
        # The value is not echoed: it is part of a secret setting.
        raise ValueError(f"URL parameter {name!r} must be {expected}")


class DbUrl:
    """The reader of --db: the URL as given, once the store can open it."""

    def __call__(self, raw: str) -> str:
        try:
            _database_url(raw)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return raw

    def check(self, name: str, value: str) -> None:
        parse_db_url(value)


class AmqpUrl:
    """The reader of --amqp: the URL (or a cluster's list) as given, once each node's is valid."""

    def __call__(self, raw: str) -> str:
        _amqp_urls(raw)
        return raw

    def check(self, name: str, value: str) -> None:
        parse_amqp_url(value)


db_url = DbUrl()
amqp_url = AmqpUrl()


def _database_url(raw: str) -> URL:
    try:
        return database_url(raw)
    except ValueError:
        # SQLAlchemy reads the port with int() and lets its ValueError out; the rest of the
        # URL is not echoed (it may hold a password).
        raise ConfigError(
            "the database URL has an invalid port (expected e.g. postgresql+psycopg://host:5432/db)"
        ) from None
