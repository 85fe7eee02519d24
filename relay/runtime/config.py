"""The relay's one configuration: RelayConfig, frozen and validated.

The flags and variables that build it are in relay/runtime/settings.py (SETTINGS, resolve). Each
field that has a rule of its own declares it (`kept`): the reader its flag's text is read with
(relay/runtime/readers.py), whose rule also checks a value given in code, so a rule is written
once. `__post_init__` applies those, then the rules between fields, which no reader can check.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TypeVar

from relay.amqp.tls import TlsOptions
from relay.core.circuit import CircuitSettings
from relay.core.policy import RetryPolicy
from relay.core.resources import SCOPES
from relay.core.retention import RetentionPolicy
from relay.core.signing import Keyring, keyring_of
from relay.core.topology import Topology
from relay.errors import ConfigError
from relay.runtime.logs import LEVELS
from relay.runtime.readers import (
    OneOf,
    Rule,
    SlotName,
    non_negative_number,
    port,
    positive_int,
    positive_number,
    rate_limits,
)
from relay.runtime.tenancy import Database, database, databases_of
from relay.runtime.urls import amqp_url, check_amqp_tls, db_url

T = TypeVar("T")

DEFAULT_DB_URL = "sqlite:///outbox.db"
DEFAULT_AMQP_URL = "amqp://guest:guest@localhost:5672/%2F"
# What a dead keyed message does to the rest of its key: holds it, or is passed over.
DEAD_KEY_MODES = ("hold", "skip")
LOG_LEVEL = OneOf(LEVELS, upper=True)
DEAD_KEY = OneOf(DEAD_KEY_MODES)
# Where the relay finds new messages: claimed from the table, or read from PostgreSQL's log
# (relay/capture/), the table serving only what cannot go at once.
CAPTURE_MODES = ("table", "logical")
CAPTURE = OneOf(CAPTURE_MODES)
SLOT_NAME = SlotName()
CIRCUIT_SCOPE = OneOf(SCOPES)  # relay/core/resources.py


def default_relay_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def kept(default: T, rule: Rule) -> T:
    """A field whose value keeps `rule`, checked when a RelayConfig is made."""
    return field(default=default, metadata={"rule": rule})


@dataclass(frozen=True, slots=True)
class RelayConfig:
    db_url: str = kept(DEFAULT_DB_URL, db_url)
    # Several databases (relay/runtime/tenancy.py): every --db given, when more than one (db_url
    # is the first), and a file of them, re-read on SIGHUP.
    db_urls: tuple[str, ...] = ()
    db_file: str | None = None
    # One URL, or a cluster's nodes separated by commas.
    amqp_url: str = kept(DEFAULT_AMQP_URL, amqp_url)
    amqp_tls: TlsOptions = field(default_factory=TlsOptions)  # for amqps:// URLs
    relay_id: str = field(default_factory=default_relay_id)
    log_level: str = kept("INFO", LOG_LEVEL)
    # The one flow-control limit: messages this relay holds in flight (claimed and not yet
    # settled), at most. The window of those sent and not yet settled sizes itself below it
    # (relay/core/window.py), each claim takes what room is left, and a killed relay leaves at
    # most this many for the next to publish again.
    max_in_flight: int = kept(2048, positive_int)
    # Rows one claim statement takes at most (not a flag: claims take the room max_in_flight
    # leaves, in statements of this size).
    claim_max: int = kept(500, positive_int)
    # Longest wait between claims when idle (a notification ends it).
    poll_interval: float = kept(0.5, positive_number)
    min_poll_interval: float = kept(0.005, positive_number)  # first wait after a claim found work
    # A claim not settled by then is taken over by another relay.
    lease_seconds: float = kept(30.0, positive_number)
    # Seconds to wait for a broker confirm before giving up.
    confirm_timeout: float = kept(20.0, positive_number)
    # Seconds to wait for in-flight confirms on shutdown.
    drain_timeout: float = kept(20.0, non_negative_number)
    # Seconds a sent batch may wait for its outcomes before the loop settles it as unconfirmed
    # (None: 3 x confirm_timeout); see max_batch_life.
    batch_life: float | None = kept(None, positive_number)
    # Seconds before the database cancels a relay statement.
    statement_timeout: float = kept(30.0, positive_number)
    # Seconds between sweeps for expired leases.
    reclaim_interval: float = kept(5.0, positive_number)
    # Each relay beats this often; one whose heartbeat is older than dead_after is taken for dead
    # and its leases taken back without waiting for them (relay/loop/pulse.py).
    heartbeat_interval: float = kept(0.5, positive_number)
    dead_after: float = kept(3.0, positive_number)
    sweep_interval: float = 5.0  # seconds between sweeps for keys freed by a dead or cancelled head
    listen: bool = True  # PostgreSQL: LISTEN for enqueue notifications (polling continues)
    dead_key: str = kept("hold", DEAD_KEY)
    capture: str = kept("table", CAPTURE)
    # The replication slot and publication --capture logical reads (outbox-relay capture setup).
    capture_slot: str = kept("outbox_relay", SLOT_NAME)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    # Delete old terminal messages between claims; None turns it off.
    retention: RetentionPolicy | None = field(default_factory=RetentionPolicy)
    circuit: CircuitSettings = field(default_factory=CircuitSettings)
    # What fails together (relay/core/resources.py).
    circuit_scope: str = kept("exchange", CIRCUIT_SCOPE)
    # Seconds between reads of the circuits other relays changed.
    circuit_refresh: float = kept(1.0, positive_number)
    # Messages per second per resource part (the exchange, at the default scope), shared by
    # every relay: three relays together keep to the rate.
    rate_limits: Mapping[str, float] = field(default_factory=dict, metadata={"rule": rate_limits})
    # /healthz, /readyz and /metrics on this port (0: off), on http_host.
    http_port: int = kept(0, port)
    http_host: str = "0.0.0.0"  # noqa: S104 - probes come from the orchestrator, not localhost
    # Secrets that sign every message (OUTBOX_SIGNING_KEYS) and per exchange
    # (OUTBOX_SIGNING_KEYS_FILE); neither: messages go unsigned. Their repr shows no secret.
    signing_keys: Keyring | None = None
    signing_keys_file: Keyring | None = None
    # Exchanges and queues declared before publishing (--topology); None: the relay declares none.
    topology: Topology | None = None

    @property
    def many_databases(self) -> bool:
        """Whether this relay serves a list of databases rather than one (db_url)."""
        return bool(self.db_urls) or self.db_file is not None

    def serving(self, database: Database) -> RelayConfig:
        """This configuration for `database` alone."""
        return replace(self, db_url=database.url, db_urls=(), db_file=None)

    def databases(self) -> list[Database]:
        """The databases to serve, named; the file read now (ConfigError when it is wrong)."""
        if not self.many_databases:
            return [database(self.db_url, "--db")]
        return databases_of(self.db_urls, self.db_file)

    @property
    def keyring(self) -> Keyring | None:
        """What signs each exchange's messages (the file's exchanges over the variable's)."""
        try:
            return keyring_of(self.signing_keys, self.signing_keys_file)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

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
        for url in self.db_urls:
            db_url.check("db_url", url)
        for f in fields(self):
            rule: Rule | None = f.metadata.get("rule")
            value = getattr(self, f.name)
            if rule is not None and value is not None:  # None: batch_life's "not set"
                rule.check(f.name, value)
        self._check_between_fields()

    def _check_between_fields(self) -> None:
        if self.dead_after < 3 * self.heartbeat_interval:
            raise ConfigError(
                f"dead_after ({self.dead_after:g}) must be at least 3 x heartbeat_interval "
                f"({self.heartbeat_interval:g}), or one late heartbeat would look like a dead relay"
            )
        if self.max_batch_life <= self.confirm_timeout:
            raise ConfigError(
                f"max batch life ({self.max_batch_life:g}) must be longer than confirm_timeout "
                f"({self.confirm_timeout:g}), or batches would be given up before the broker could"
                " answer"
            )
        if self.lease_seconds <= self.confirm_timeout:
            raise ConfigError(
                f"lease_seconds ({self.lease_seconds}) must be longer than confirm_timeout "
                f"({self.confirm_timeout}), or another relay could resend a message still in flight"
            )
        p = self.policy
        # The floor is derived from --backoff-base (settings.build), so no reader sees it.
        if not 0 < p.floor <= p.cap:
            raise ConfigError(f"backoff needs 0 < floor ({p.floor}) <= cap ({p.cap})")
        c = self.circuit
        if not c.cooldown <= c.max_cooldown:
            raise ConfigError(
                f"circuit cooldown ({c.cooldown:g}) must not be longer than its maximum "
                f"({c.max_cooldown:g})"
            )
        if c.probe_timeout <= self.confirm_timeout:
            raise ConfigError(
                f"circuit probe timeout ({c.probe_timeout:g}) must be longer than confirm_timeout "
                f"({self.confirm_timeout:g}), or a second relay could probe while the first waits"
            )
        check_amqp_tls(self.amqp_url, self.amqp_tls)
        _ = self.keyring  # two defaults for every exchange: refused here, not when publishing
