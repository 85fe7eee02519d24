"""The relay's one configuration: RelayConfig, frozen and validated, and the table of settings
that builds it from flags and environment variables.

Each setting is declared once, in SETTINGS: its flag, its variable, how its text is read, its help
and the commands that read it. The CLI gives argparse no defaults; `resolve` takes, per setting, the
flag, else the variable, else RelayConfig's default, and reads the variable's text only then, so a
bad value is reported under the name it came from, and only by a command that reads it.
"""

from __future__ import annotations

import ast
import ipaddress
import math
import os
import re
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sqlalchemy.engine import URL

from relay.amqp.tls import TlsOptions
from relay.core.circuit import CircuitSettings
from relay.core.durations import MAX_SECONDS as MAX_DURATION_SECONDS
from relay.core.durations import format_duration, positive_duration
from relay.core.failures import FailureClass
from relay.core.policy import RetryPolicy
from relay.core.resources import SCOPES
from relay.core.retention import RetentionPolicy
from relay.core.urls import redact, split_urls
from relay.errors import ConfigError
from relay.runtime.logs import LEVELS
from relay.store.databases import database_url

DEFAULT_DB_URL = "sqlite:///outbox.db"
DEFAULT_AMQP_URL = "amqp://guest:guest@localhost:5672/%2F"
# What a dead keyed message does to the rest of its key: holds it, or is passed over.
DEAD_KEY_MODES = ("hold", "skip")
# The largest count accepted: what a database INTEGER holds (attempts, limits are bound into SQL).
MAX_INT = 2**31 - 1
# The longest time in seconds accepted: longer is a typo, and would overflow a wait
# (threading.TIMEOUT_MAX) or a database interval.
MAX_SECONDS = MAX_DURATION_SECONDS


def default_relay_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class RelayConfig:
    db_url: str = DEFAULT_DB_URL
    amqp_url: str = DEFAULT_AMQP_URL  # one URL, or a cluster's nodes separated by commas
    amqp_tls: TlsOptions = field(default_factory=TlsOptions)  # for amqps:// URLs
    relay_id: str = field(default_factory=default_relay_id)
    log_level: str = "INFO"  # one of relay.runtime.logs.LEVELS
    batch_size: int = 500  # rows per claim
    max_in_flight: int = 5000  # published, unconfirmed messages; bounds memory and redelivery
    # Messages handed to the publisher and not yet marked (or settled otherwise), at most: what a
    # killed relay can leave sent and unmarked, for the next to publish again; the rest of a claim
    # waits in memory.
    max_unconfirmed: int = 256
    poll_interval: float = 0.5  # longest wait between claims when idle (a notification ends it)
    min_poll_interval: float = 0.005  # first wait after a claim found work
    lease_seconds: float = 30.0  # a claim not settled by then is taken over by another relay
    confirm_timeout: float = 20.0  # seconds to wait for a broker confirm before giving up
    drain_timeout: float = 20.0  # seconds to wait for in-flight confirms on shutdown
    # Seconds a sent batch may wait for its outcomes before the loop settles it as unconfirmed
    # (None: 3 x confirm_timeout); see max_batch_life.
    batch_life: float | None = None
    statement_timeout: float = 30.0  # seconds before the database cancels a relay statement
    reclaim_interval: float = 5.0  # seconds between sweeps for expired leases
    # Each relay beats this often; one whose heartbeat is older than dead_after is taken for dead
    # and its leases taken back without waiting for them (relay/loop/pulse.py).
    heartbeat_interval: float = 0.5
    dead_after: float = 3.0
    sweep_interval: float = 5.0  # seconds between sweeps for keys freed by a dead or cancelled head
    listen: bool = True  # PostgreSQL: LISTEN for enqueue notifications (polling continues)
    dead_key: str = "hold"  # one of DEAD_KEY_MODES
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    # Delete old terminal messages between claims; None turns it off.
    retention: RetentionPolicy | None = field(default_factory=RetentionPolicy)
    circuit: CircuitSettings = field(default_factory=CircuitSettings)
    # What fails together (relay/core/resources.py): one of SCOPES.
    circuit_scope: str = "exchange"
    circuit_refresh: float = 1.0  # seconds between reads of the circuits other relays changed
    # Messages per second per resource part (the exchange, at the default scope), shared by
    # every relay: three relays together keep to the rate.
    rate_limits: Mapping[str, float] = field(default_factory=dict)
    # /healthz, /readyz and /metrics on this port (0: off), on http_host.
    http_port: int = 0
    http_host: str = "0.0.0.0"  # noqa: S104 - probes come from the orchestrator, not localhost

    @property
    def max_batch_life(self) -> float:
        """How long a sent batch may wait for the publisher: past it, its rows are settled as
        unconfirmed (no attempt charged) rather than leased for ever."""
        return self.batch_life if self.batch_life is not None else 3 * self.confirm_timeout

    @property
    def hold_dead_keys(self) -> bool:
        """Whether a dead message holds the rest of its key (what the store needs to know)."""
        return self.dead_key == "hold"

    def __post_init__(self) -> None:
        _positive("batch_size", self.batch_size)
        _positive("max_in_flight", self.max_in_flight)
        for name in (
            "poll_interval",
            "min_poll_interval",
            "lease_seconds",
            "confirm_timeout",
            "reclaim_interval",
            "heartbeat_interval",
        ):
            _positive(name, getattr(self, name))
        _positive("max_unconfirmed", self.max_unconfirmed)
        if self.dead_after < 3 * self.heartbeat_interval:
            raise ConfigError(
                f"dead_after ({self.dead_after:g}) must be at least 3 x heartbeat_interval "
                f"({self.heartbeat_interval:g}), or one late heartbeat would look like a dead relay"
            )
        if self.log_level not in LEVELS:
            raise ConfigError(
                f"log level must be one of {', '.join(LEVELS)}, not {self.log_level!r}"
            )
        if self.dead_key not in DEAD_KEY_MODES:
            raise ConfigError(
                f"dead_key must be one of {', '.join(DEAD_KEY_MODES)}, not {self.dead_key!r}"
            )
        if self.drain_timeout < 0:
            raise ConfigError(f"drain_timeout must not be negative, got {self.drain_timeout}")
        p = self.policy
        if p.max_attempts < 1 or any(n < 1 for n in p.max_attempts_by_exchange.values()):
            raise ConfigError("max attempts must be at least 1")
        if not 0 < p.floor <= p.cap or p.base <= 0:
            raise ConfigError(
                f"backoff needs 0 < floor ({p.floor}) <= cap ({p.cap}) and a positive base"
            )
        if p.max_age is not None and p.max_age <= 0:
            raise ConfigError(f"max age must be positive, got {p.max_age}")
        if self.max_batch_life <= self.confirm_timeout:
            raise ConfigError(
                f"max batch life ({self.max_batch_life:g}) must be longer than confirm_timeout "
                f"({self.confirm_timeout:g}), or batches would be given up before the broker could"
                " answer"
            )
        _positive("statement_timeout", self.statement_timeout)
        if self.lease_seconds <= self.confirm_timeout:
            raise ConfigError(
                f"lease_seconds ({self.lease_seconds}) must be longer than confirm_timeout "
                f"({self.confirm_timeout}), or another relay could resend a message still in flight"
            )
        c = self.circuit
        if c.threshold < 1:
            raise ConfigError(f"circuit threshold must be at least 1, got {c.threshold}")
        if not 0 < c.cooldown <= c.max_cooldown:
            raise ConfigError(
                f"circuit cooldown needs 0 < cooldown ({c.cooldown:g}) <= max ({c.max_cooldown:g})"
            )
        if c.probe_timeout <= self.confirm_timeout:
            raise ConfigError(
                f"circuit probe timeout ({c.probe_timeout:g}) must be longer than confirm_timeout "
                f"({self.confirm_timeout:g}), or a second relay could probe while the first waits"
            )
        if self.circuit_scope not in SCOPES:
            raise ConfigError(
                f"circuit scope must be one of {', '.join(SCOPES)}, not {self.circuit_scope!r}"
            )
        _positive("circuit_refresh", self.circuit_refresh)
        if not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http port must be between 0 and 65535, got {self.http_port}")
        for part, rate in self.rate_limits.items():
            if not rate > 0:
                raise ConfigError(f"rate limit for {part!r} must be positive, got {rate}")
        parse_db_url(self.db_url)
        parse_amqp_url(self.amqp_url)
        check_amqp_tls(self.amqp_url, self.amqp_tls)


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")


# --------------------------------------------------------------------------- URLs


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


def check_amqp_tls(amqp_url: str, tls: TlsOptions) -> None:
    """The TLS options fit the URLs (every one amqps://, none with pika's own `ssl_options`)
    and their files make a context; ConfigError naming the option otherwise."""
    given = tls.given
    if not given:
        return
    for url in split_urls(amqp_url):
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
# how to say it. Checked here so a bad one is a usage error naming it, not pika's traceback.
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


# --------------------------------------------------------------------------- reading text
# Each reader turns a flag's or a variable's text into a value, or raises ValueError with a
# message that starts with the text: "'abc' is not an integer".


def positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"{raw!r} must be positive")
    if value > MAX_INT:
        raise ValueError(f"{raw!r} is too large (at most {MAX_INT})")
    return value


def _number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} is not a finite number")
    if abs(value) > MAX_SECONDS:
        raise ValueError(f"{raw!r} is too large (at most {MAX_SECONDS:.0f} seconds, 100 years)")
    return value


def positive_number(raw: str) -> float:
    value = _number(raw)
    if not value > 0:
        raise ValueError(f"{raw!r} must be positive")
    return value


def non_negative_number(raw: str) -> float:
    value = _number(raw)
    if value < 0:
        raise ValueError(f"{raw!r} must not be negative")
    return value


def age(raw: str) -> float | None:
    """A positive duration, or 'forever' (None)."""
    return None if raw.strip().lower() == "forever" else positive_duration(raw)


def port(raw: str) -> int:
    # isascii: isdigit() alone accepts "²", which int() refuses.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or int(raw) > 65535:
        raise ValueError(f"{raw!r} is not a port number (0 to 65535)")
    return int(raw)


def switch(raw: str) -> bool:
    words = {"1": True, "true": True, "yes": True, "on": True,
             "0": False, "false": False, "no": False, "off": False}  # fmt: skip
    try:
        return words[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"{raw!r} is not on or off (use 1/0, true/false, yes/no)") from None


def text(raw: str) -> str:
    if not raw.strip():
        raise ValueError(f"{raw!r} is empty")
    return raw.strip()


def failure_classes(raw: str) -> frozenset[FailureClass]:
    """Comma-separated failure class names, or 'none'."""
    if raw.strip().lower() == "none":
        return frozenset()
    names = [n.strip() for n in raw.split(",") if n.strip()]
    known = {c.value: c for c in FailureClass}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"{raw!r} names an unknown failure class {', '.join(unknown)} "
            f"(known: {', '.join(known)})"
        )
    return frozenset(known[n] for n in names)


def _pairs(raw: str, read: Callable[[str, str], tuple[str, Any]]) -> dict[str, Any]:
    return dict(read(item.strip(), raw) for item in raw.split(",") if item.strip())


def exchange_limits(raw: str) -> dict[str, int]:
    """Comma-separated EXCHANGE=N."""

    def read(item: str, whole: str) -> tuple[str, int]:
        name, sep, number = item.rpartition("=")
        ok = number.isascii() and number.isdigit() and len(number) <= 10
        if not sep or not ok or not 1 <= int(number) <= MAX_INT:
            raise ValueError(f"{whole!r}: {item!r} is not EXCHANGE=N with 1 <= N <= {MAX_INT}")
        return name, int(number)

    return _pairs(raw, read)


def rate_limits(raw: str) -> dict[str, float]:
    """Comma-separated RESOURCE=RATE, in messages per second."""

    def read(item: str, whole: str) -> tuple[str, float]:
        name, sep, number = item.rpartition("=")
        try:
            rate = float(number)
        except ValueError:
            rate = 0.0
        if not sep or not (rate > 0 and math.isfinite(rate)):
            raise ValueError(
                f"{whole!r}: {item!r} is not RESOURCE=RATE with RATE > 0 messages per second"
            )
        return name, rate

    return _pairs(raw, read)


def db_url(raw: str) -> str:
    try:
        _database_url(raw)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return raw


def _database_url(raw: str) -> URL:
    try:
        return database_url(raw)
    except ValueError:
        # SQLAlchemy reads the port with int() and lets its ValueError out; the rest of the
        # URL is not echoed (it may hold a password).
        raise ConfigError(
            "the database URL has an invalid port (expected e.g. postgresql+psycopg://host:5432/db)"
        ) from None


def amqp_url(raw: str) -> str:
    _amqp_urls(raw)
    return raw


def readable_file(raw: str) -> str:
    """A path to a file this process can read (its content is checked where it is used)."""
    path = raw.strip()
    if not path:
        raise ValueError(f"{raw!r} is empty")
    if not os.path.exists(path):
        raise ValueError(f"{raw!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"{raw!r} is not a file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ValueError(f"{raw!r} cannot be read: {exc.strerror or exc}") from None
    return path


def host_name(raw: str) -> str:
    """A DNS name or an IP address, as a TLS certificate carries it."""
    name = raw.strip()
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    labels = name.rstrip(".").split(".")
    ok = 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in labels)
    if not ok:
        raise ValueError(f"{raw!r} is not a host name (e.g. rabbit.example.com)")
    return name


_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


@dataclass(frozen=True, slots=True)
class OneOf:
    """A reader that accepts one of `choices` (upper-cased first when `upper`)."""

    choices: tuple[str, ...]
    upper: bool = False

    def __call__(self, raw: str) -> str:
        value = raw.strip().upper() if self.upper else raw.strip()
        if value not in self.choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(self.choices)}")
        return value


# --------------------------------------------------------------------------- the settings

RUN = frozenset({"run"})
# The commands that talk to the broker; the others need no AMQP URL.
BROKER_COMMANDS = frozenset({"run", "demo", "demo-producer", "demo-consumer"})


@dataclass(frozen=True, slots=True)
class Setting:
    """One option of the relay: its flag, its environment variable, and who reads it."""

    flag: str  # "--batch-size"; its dest ("batch_size") names the setting
    env: str | None  # the environment variable; None: a flag only
    target: str  # what it sets in RelayConfig, dotted for a part of one: "policy.max_age"
    read: Callable[[str], Any]  # text -> value; see "reading text" above
    help: str
    commands: frozenset[str] | None = RUN  # the commands that read it; None: every command
    not_for: frozenset[str] = frozenset()  # exceptions to `commands`
    everywhere: bool = False  # a global option: accepted before or after any command's name
    show: Callable[[Any], str] = str  # the default as --help writes it
    metavar: str | None = None
    secret: bool = False  # may hold a password: a value is never echoed, the default redacted
    repeat: bool = False  # repeated flags add up; the variable is comma-separated
    switch: bool = False  # --flag / --no-flag (`read` is then `switch`, for the variable)

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def used_by(self, command: str) -> bool:
        listed = self.commands is None or command in self.commands
        return listed and command not in self.not_for

    def default(self) -> Any:
        value: Any = _defaults()
        for name in self.target.split("."):
            value = getattr(value, name)
        return value

    def default_text(self) -> str:
        """The default as --help writes it."""
        text = self.show(self.default())
        return redact(text) if self.secret else text

    def from_env(self, raw: str) -> Any:
        """The variable's value; ConfigError naming the variable when it cannot be read."""
        assert self.env is not None
        try:
            return self.read(raw)
        except ValueError as exc:
            message = str(exc)
            if self.secret:
                # Not echoed: a value that does not parse may hide a password from redact().
                raise ConfigError(f"{self.env}: {message}") from None
            said = repr(raw)
            # Readers start with the text they were given; say it once.
            problem = message if message.startswith(said) else f"{said}: {message}"
            raise ConfigError(f"{self.env}={problem}") from None


@cache
def _defaults() -> RelayConfig:
    return RelayConfig()


def _seconds(value: float) -> str:
    return f"{value:g}"


def _age_text(value: float | None) -> str:
    return "forever" if value is None else format_duration(value)


def _mapping_text(value: Mapping[str, object]) -> str:
    pairs = (f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
    return ",".join(pairs) or "none"


def _classes_text(value: frozenset[FailureClass]) -> str:
    return ",".join(sorted(c.value for c in value)) or "none"


def _none_text(value: str | None) -> str:
    return value or "none"


def _system_cas(value: str | None) -> str:
    return value or "the system's"


SETTINGS: tuple[Setting, ...] = (
    # Global options: every command accepts them, before or after its name.
    Setting("--db", "OUTBOX_DB_URL", "db_url", db_url, "SQLAlchemy database URL",
            commands=None, not_for=frozenset({"demo"}), everywhere=True, metavar="URL",
            secret=True),
    Setting("--amqp", "OUTBOX_AMQP_URL", "amqp_url", amqp_url,
            "AMQP URL of the broker; a cluster's nodes as several URLs separated by commas, "
            "tried in order",
            commands=BROKER_COMMANDS, everywhere=True, metavar="URL", secret=True),
    Setting("--amqp-ca-file", "OUTBOX_AMQP_CA_FILE", "amqp_tls.ca_file", readable_file,
            "amqps://: verify the broker's certificate with these PEM CA certificates",
            commands=BROKER_COMMANDS, everywhere=True, show=_system_cas, metavar="FILE"),
    Setting("--amqp-cert-file", "OUTBOX_AMQP_CERT_FILE", "amqp_tls.cert_file", readable_file,
            "amqps://: client certificate (PEM) for a broker that asks for one; it may hold "
            "the key too", commands=BROKER_COMMANDS, everywhere=True, show=_none_text,
            metavar="FILE"),
    Setting("--amqp-key-file", "OUTBOX_AMQP_KEY_FILE", "amqp_tls.key_file", readable_file,
            "amqps://: the client certificate's private key (PEM, unencrypted)",
            commands=BROKER_COMMANDS, everywhere=True, show=_none_text, metavar="FILE"),
    Setting("--amqp-server-name", "OUTBOX_AMQP_SERVER_NAME", "amqp_tls.server_name", host_name,
            "amqps://: the name the broker's certificate must carry, also sent as SNI",
            commands=BROKER_COMMANDS, everywhere=True, show=lambda v: v or "each URL's host",
            metavar="NAME"),
    Setting("--log-level", "OUTBOX_LOG_LEVEL", "log_level", OneOf(LEVELS, upper=True),
            "log level", commands=None, everywhere=True),
    # `run`: the relay.
    Setting("--relay-id", "OUTBOX_RELAY_ID", "relay_id", text,
            "name of this relay in leases and logs", show=lambda _: "HOSTNAME:PID", metavar="ID"),
    Setting("--batch-size", "OUTBOX_BATCH_SIZE", "batch_size", positive_int,
            "rows claimed at a time", metavar="N"),
    Setting("--max-in-flight", "OUTBOX_MAX_IN_FLIGHT", "max_in_flight", positive_int,
            "unconfirmed messages at most", metavar="N"),
    Setting("--max-unconfirmed", "OUTBOX_MAX_UNCONFIRMED", "max_unconfirmed", positive_int,
            "messages published and not yet marked at most: what a killed relay can leave for "
            "the next to publish again", metavar="N"),
    Setting("--heartbeat-interval", "OUTBOX_HEARTBEAT_INTERVAL", "heartbeat_interval",
            positive_number, "seconds between this relay's heartbeats", show=_seconds,
            metavar="SECONDS"),
    Setting("--dead-after", "OUTBOX_DEAD_AFTER", "dead_after", positive_number,
            "seconds without a heartbeat after which a relay is taken for dead and its leases "
            "are taken back (at least 3 x --heartbeat-interval)", show=_seconds,
            metavar="SECONDS"),
    Setting("--poll-interval", "OUTBOX_POLL_INTERVAL", "poll_interval", positive_number,
            "longest wait in seconds between claims when idle; right after work the relay looks "
            "again within milliseconds", show=_seconds, metavar="SECONDS"),
    Setting("--listen", "OUTBOX_LISTEN", "listen", switch,
            "on PostgreSQL, LISTEN for enqueue notifications to wake at once (polling continues "
            "either way, e.g. behind pgbouncer)", show=lambda on: "on" if on else "off",
            switch=True),
    Setting("--lease", "OUTBOX_LEASE_SECONDS", "lease_seconds", positive_number,
            "seconds a claim is held before others may take it over", show=_seconds,
            metavar="SECONDS"),
    Setting("--max-attempts", "OUTBOX_MAX_ATTEMPTS", "policy.max_attempts", positive_int,
            "attempts before a message is dead-lettered, unless it sets its own", metavar="N"),
    Setting("--max-attempts-for", None, "policy.max_attempts_by_exchange", exchange_limits,
            "max attempts for one exchange; repeatable, or comma-separated",
            show=_mapping_text, metavar="EXCHANGE=N", repeat=True),
    Setting("--max-age", "OUTBOX_MAX_AGE", "policy.max_age", positive_duration,
            "dead-letter a failing message this old", show=_age_text, metavar="DURATION"),
    Setting("--backoff-base", "OUTBOX_BACKOFF_BASE", "policy.base", positive_duration,
            "first backoff window", show=format_duration, metavar="DURATION"),
    Setting("--backoff-cap", "OUTBOX_BACKOFF_CAP", "policy.cap", positive_duration,
            "longest backoff window", show=format_duration, metavar="DURATION"),
    Setting("--permanent", "OUTBOX_PERMANENT", "policy.permanent", failure_classes,
            "failure classes dead-lettered at once, comma-separated, or 'none' (malformed rows "
            "are dead whatever this says)", show=_classes_text, metavar="CLASSES"),
    Setting("--retain-published", "OUTBOX_RETAIN_PUBLISHED", "retention.published_after", age,
            "delete published messages this long after publishing, or 'forever'",
            show=_age_text, metavar="DURATION"),
    Setting("--retain-failed", "OUTBOX_RETAIN_FAILED", "retention.failed_after", age,
            "delete dead, discarded and cancelled messages this old, or 'forever'",
            show=_age_text, metavar="DURATION"),
    Setting("--dead-key", "OUTBOX_DEAD_KEY", "dead_key", OneOf(DEAD_KEY_MODES),
            "when a keyed message is dead-lettered, hold the rest of its key until an operator "
            "replays or discards it, or skip past it"),
    Setting("--circuit-threshold", "OUTBOX_CIRCUIT_THRESHOLD", "circuit.threshold", positive_int,
            "consecutive failures of one resource that open its circuit", metavar="N"),
    Setting("--circuit-cooldown", "OUTBOX_CIRCUIT_COOLDOWN", "circuit.cooldown",
            positive_duration, "first open period; it doubles while the resource keeps failing",
            show=format_duration, metavar="DURATION"),
    Setting("--circuit-max-cooldown", "OUTBOX_CIRCUIT_MAX_COOLDOWN", "circuit.max_cooldown",
            positive_duration, "longest open period", show=format_duration, metavar="DURATION"),
    Setting("--circuit-scope", "OUTBOX_CIRCUIT_SCOPE", "circuit_scope", OneOf(SCOPES),
            "what fails together and shares a circuit: the broker (and vhost), each exchange, "
            "or each exchange and routing key; the same on every relay"),
    Setting("--rate-limit", "OUTBOX_RATE_LIMITS", "rate_limits", rate_limits,
            "messages per second for one resource (its exchange at the default scope), shared "
            "by every relay; repeatable, or comma-separated", show=_mapping_text,
            metavar="RESOURCE=RATE", repeat=True),
    Setting("--http-port", "OUTBOX_HTTP_PORT", "http_port", port,
            "serve /healthz, /readyz and /metrics on this port; 0 turns it off", metavar="PORT"),
    Setting("--http-host", "OUTBOX_HTTP_HOST", "http_host", text, "address for --http-port",
            metavar="HOST"),
    Setting("--confirm-timeout", "OUTBOX_CONFIRM_TIMEOUT", "confirm_timeout", positive_number,
            "seconds to wait for a broker confirm", show=_seconds, metavar="SECONDS"),
    Setting("--drain-timeout", "OUTBOX_DRAIN_TIMEOUT", "drain_timeout", non_negative_number,
            "seconds to wait for in-flight confirms on shutdown", show=_seconds,
            metavar="SECONDS"),
    Setting("--max-batch-life", "OUTBOX_MAX_BATCH_LIFE", "batch_life", positive_number,
            "seconds a published batch may wait for the broker's answers before its messages "
            "are retried (default: 3 x --confirm-timeout)",
            show=lambda v: "3 x confirm timeout" if v is None else _seconds(v),
            metavar="SECONDS"),
    Setting("--statement-timeout", "OUTBOX_STATEMENT_TIMEOUT", "statement_timeout",
            positive_number, "seconds before the database cancels one of the relay's statements "
            "(PostgreSQL and MariaDB: any statement; MySQL: SELECTs; not set behind a pooler)",
            show=_seconds, metavar="SECONDS"),
)  # fmt: skip


def settings_for(command: str) -> tuple[Setting, ...]:
    """The settings only `command` has flags for (the global options aside)."""
    return tuple(s for s in SETTINGS if not s.everywhere and s.used_by(command))


def resolve(command: str, flags: Mapping[str, Any], environ: Mapping[str, str]) -> RelayConfig:
    """The configuration `command` runs with.

    `flags` holds the values argparse read, by dest (None: not given). Each setting takes its
    flag, else its variable (an empty one counts as unset), else RelayConfig's default. A command
    reads only the variables of the settings it uses, so a bad one it ignores stops nothing.
    """
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if flags.get(setting.dest) is not None:
            values[setting.target] = flags[setting.dest]
        elif setting.env and setting.used_by(command) and environ.get(setting.env, "").strip():
            values[setting.target] = setting.from_env(environ[setting.env])
    return build(values)


_PARTS: Mapping[str, Callable[..., Any]] = {
    "amqp_tls": TlsOptions,
    "policy": RetryPolicy,
    "retention": RetentionPolicy,
    "circuit": CircuitSettings,
}


def build(values: Mapping[str, Any]) -> RelayConfig:
    """RelayConfig from values by field path; what is not given keeps its default."""
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        head, _, tail = path.partition(".")
        if tail:
            parts.setdefault(head, {})[tail] = value
        else:
            top[head] = value
    policy = parts.get("policy", {})
    if "base" in policy:
        # The shortest backoff never exceeds the first window.
        policy["floor"] = min(RetryPolicy().floor, policy["base"])
    if "confirm_timeout" in top:
        # Longer than a confirm can take, so a probe in flight is never taken over.
        parts.setdefault("circuit", {})["probe_timeout"] = max(
            CircuitSettings().probe_timeout, 2 * top["confirm_timeout"]
        )
    for head, kwargs in parts.items():
        top[head] = _PARTS[head](**kwargs)
    return RelayConfig(**top)
