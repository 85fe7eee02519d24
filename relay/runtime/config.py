"""One frozen, validated configuration for the relay, built from flags and environment."""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from relay.core.circuit import CircuitSettings
from relay.core.policy import RetryPolicy
from relay.errors import ConfigError
from relay.loop.maintenance import RetentionPolicy

DEFAULT_DB_URL = "sqlite:///outbox.db"
DEFAULT_AMQP_URL = "amqp://guest:guest@localhost:5672/%2F"


def default_relay_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class RelayConfig:
    db_url: str = DEFAULT_DB_URL
    amqp_url: str = DEFAULT_AMQP_URL
    relay_id: str = field(default_factory=default_relay_id)
    batch_size: int = 500  # rows per claim
    max_in_flight: int = 5000  # published, unconfirmed messages; bounds memory and redelivery
    poll_interval: float = 0.5  # longest wait between claims when idle (a notification ends it)
    min_poll_interval: float = 0.005  # first wait after a claim found work
    lease_seconds: float = 30.0  # a claim not settled by then is taken over by another relay
    confirm_timeout: float = 20.0  # seconds to wait for a broker confirm before giving up
    drain_timeout: float = 20.0  # seconds to wait for in-flight confirms on shutdown
    reclaim_interval: float = 5.0  # seconds between sweeps for expired leases
    sweep_interval: float = 5.0  # seconds between sweeps for keys freed by a dead or cancelled head
    listen: bool = True  # PostgreSQL: LISTEN for enqueue notifications (polling continues)
    dead_key: str = "hold"  # a dead head holds its key ("hold") or is passed over ("skip")
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    # Delete old terminal messages between claims; None turns it off.
    retention: RetentionPolicy | None = field(default_factory=RetentionPolicy)
    circuit: CircuitSettings = field(default_factory=CircuitSettings)
    # What fails together (relay/resources.py): "broker", "exchange" or "routing_key".
    circuit_scope: str = "exchange"
    circuit_refresh: float = 1.0  # seconds between reads of the circuits other relays changed
    # Messages per second per resource part (the exchange, at the default scope), shared by
    # every relay: three relays together keep to the rate.
    rate_limits: Mapping[str, float] = field(default_factory=dict)
    # /healthz, /readyz and /metrics on this port (0: off), on http_host.
    http_port: int = 0
    http_host: str = "0.0.0.0"  # noqa: S104 - probes come from the orchestrator, not localhost

    def __post_init__(self) -> None:
        _positive("batch_size", self.batch_size)
        _positive("max_in_flight", self.max_in_flight)
        for name in (
            "poll_interval",
            "min_poll_interval",
            "lease_seconds",
            "confirm_timeout",
            "reclaim_interval",
        ):
            _positive(name, getattr(self, name))
        if self.dead_key not in ("hold", "skip"):
            raise ConfigError(f"dead_key must be 'hold' or 'skip', not {self.dead_key!r}")
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
        if self.circuit_scope not in ("broker", "exchange", "routing_key"):
            raise ConfigError(
                f"circuit scope must be broker, exchange or routing_key, not {self.circuit_scope!r}"
            )
        _positive("circuit_refresh", self.circuit_refresh)
        if not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http port must be between 0 and 65535, got {self.http_port}")
        for part, rate in self.rate_limits.items():
            if not rate > 0:
                raise ConfigError(f"rate limit for {part!r} must be positive, got {rate}")
        parse_db_url(self.db_url)
        parse_amqp_url(self.amqp_url)


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")


def parse_db_url(raw: str) -> URL:
    """Validate a SQLAlchemy URL; raise ConfigError naming the problem."""
    try:
        url = make_url(raw)
    except ArgumentError:
        raise ConfigError(
            f"--db: cannot parse {redact(raw)!r} as a database URL "
            "(expected e.g. postgresql+psycopg://user@host/db or sqlite:///outbox.db)"
        ) from None
    backend = url.get_backend_name()
    if backend not in ("postgresql", "sqlite"):
        raise ConfigError(f"--db: unsupported database {backend!r} (use postgresql or sqlite)")
    if url.drivername == "postgresql":
        # A plain postgresql:// URL means psycopg 3, the driver this project ships with.
        return url.set(drivername="postgresql+psycopg")
    if backend == "postgresql" and url.get_driver_name() != "psycopg":
        raise ConfigError(f"--db: unsupported driver {url.drivername!r} (use postgresql+psycopg)")
    return url


def parse_amqp_url(raw: str) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("amqp", "amqps"):
        raise ConfigError(
            f"--amqp: {redact(raw)!r} is not an AMQP URL (expected amqp://user:pass@host:5672/vhost)"
        )
    if not parts.hostname:
        raise ConfigError(f"--amqp: {redact(raw)!r} names no host")
    try:
        _ = parts.port
    except ValueError:
        raise ConfigError(f"--amqp: {redact(raw)!r} has an invalid port") from None
    return parts


def redact(raw: str) -> str:
    """The URL with its password replaced, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(raw)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparseable URL>"
    return raw
