"""The table of settings that builds the relay's RelayConfig from flags and environment variables.

Each setting is declared once, in SETTINGS: its flag, its variable, how its text is read
(relay/runtime/readers.py), its help and the commands that read it. The CLI gives argparse no
defaults; `resolve` takes, per setting, the flag, else the variable, else RelayConfig's default,
and reads the variable's text only then, so a bad value is reported under the name it came from,
and only by a command that reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from relay.amqp.tls import TlsOptions
from relay.core.circuit import CircuitSettings
from relay.core.durations import format_duration, positive_duration
from relay.core.failures import FailureClass
from relay.core.policy import RetryPolicy
from relay.core.retention import RetentionPolicy
from relay.core.signing import keys_text
from relay.core.urls import redact
from relay.errors import ConfigError
from relay.runtime.config import (
    CAPTURE,
    CIRCUIT_SCOPE,
    DEAD_KEY,
    LOG_LEVEL,
    SLOT_NAME,
    RelayConfig,
)
from relay.runtime.readers import (
    age,
    duration_or_zero,
    exchange_limits,
    failure_classes,
    host_name,
    non_negative_number,
    port,
    positive_int,
    positive_number,
    rate_limits,
    readable_file,
    signing_keys_file,
    switch,
    text,
    topology_file,
)
from relay.runtime.urls import amqp_url, db_url

RUN = frozenset({"run"})
# The commands that serve several databases (--db repeated, --db-file).
MANY_DATABASES = frozenset({"run", "status", "migrate", "messages", "show"})
# The commands that talk to the broker; the others need no AMQP URL.
BROKER_COMMANDS = frozenset({"run", "demo", "demo-producer", "demo-consumer", "topology"})


@dataclass(frozen=True, slots=True)
class Setting:
    """One option of the relay: its flag, its environment variable, and who reads it."""

    flag: str  # "--max-in-flight"; its dest ("max_in_flight") names the setting
    env: str | None  # the environment variable; None: a flag only
    target: str  # what it sets in RelayConfig, dotted for a part of one: "policy.max_age"
    read: Callable[[str], Any]  # text -> value (relay/runtime/readers.py)
    help: str
    commands: frozenset[str] | None = RUN  # the commands that read it; None: every command
    not_for: frozenset[str] = frozenset()  # exceptions to `commands`
    everywhere: bool = False  # a global option: accepted before or after any command's name
    show: Callable[[Any], str] = str  # the default as --help writes it
    metavar: str | None = None
    secret: bool = False  # may hold a password: a value is never echoed, the default redacted
    blank_refused: bool = False  # an empty variable is read (and refused), not taken as unset
    repeat: bool = False  # repeated flags add up; the variable is comma-separated
    # Repeatable: the first value goes to `target`, all of them to this field when several are
    # given (--db). The variable holds one value.
    many: str | None = None
    switch: bool = False  # --flag / --no-flag (`read` is then `switch`, for the variable)
    # An old flag, still accepted: what the relay logs when it is given (`target` "": no effect).
    replaced: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def used_by(self, command: str) -> bool:
        listed = self.commands is None or command in self.commands
        return listed and command not in self.not_for

    def default(self) -> Any:
        if not self.target:
            return None
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
    Setting("--db", "OUTBOX_DB_URL", "db_url", db_url,
            "SQLAlchemy database URL; repeat it to serve several databases (run, status, "
            "migrate, messages, show)", commands=None, not_for=frozenset({"demo"}), everywhere=True,
            metavar="URL", secret=True, many="db_urls"),
    Setting("--db-file", "OUTBOX_DB_FILE", "db_file", readable_file,
            "a file of databases to serve, one URL or NAME = URL per line; `run` reads it "
            "again on SIGHUP", commands=MANY_DATABASES, everywhere=True, show=_none_text,
            metavar="FILE"),
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
    Setting("--log-level", "OUTBOX_LOG_LEVEL", "log_level", LOG_LEVEL,
            "log level", commands=None, everywhere=True),
    # `run`: the relay.
    Setting("--relay-id", "OUTBOX_RELAY_ID", "relay_id", text,
            "name of this relay in leases and logs", show=lambda _: "HOSTNAME:PID", metavar="ID"),
    Setting("--max-in-flight", "OUTBOX_MAX_IN_FLIGHT", "max_in_flight", positive_int,
            "messages the relay holds in flight (claimed, not yet settled) at most: the one "
            "flow-control limit; the window of those sent sizes itself below it to the broker's "
            "confirm round, and a killed relay leaves at most this many to publish again",
            metavar="N"),
    Setting("--max-unconfirmed", "OUTBOX_MAX_UNCONFIRMED", "max_in_flight", positive_int,
            "the old name of --max-in-flight", metavar="N",
            replaced="--max-unconfirmed is --max-in-flight now: the one flow-control limit"),
    Setting("--batch-size", "OUTBOX_BATCH_SIZE", "", positive_int,
            "no effect: claims take what room --max-in-flight leaves", metavar="N",
            show=lambda _: "-",
            replaced="--batch-size has no effect: each claim takes what room --max-in-flight "
            "leaves"),
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
    Setting("--unroutable-grace", "OUTBOX_UNROUTABLE_GRACE", "policy.unroutable_grace",
            duration_or_zero, "how long an unroutable message (no queue bound for its exchange "
            "and routing key) is deferred, no attempt charged, before it is dead-lettered; "
            "0: at once", show=format_duration, metavar="DURATION"),
    Setting("--retain-published", "OUTBOX_RETAIN_PUBLISHED", "retention.published_after", age,
            "delete published messages this long after publishing, or 'forever'",
            show=_age_text, metavar="DURATION"),
    Setting("--retain-failed", "OUTBOX_RETAIN_FAILED", "retention.failed_after", age,
            "delete dead, discarded and cancelled messages this old, or 'forever'",
            show=_age_text, metavar="DURATION"),
    Setting("--dead-key", "OUTBOX_DEAD_KEY", "dead_key", DEAD_KEY,
            "when a keyed message is dead-lettered, hold the rest of its key until an operator "
            "replays or discards it, or skip past it", commands=RUN | {"sql"}),
    Setting("--capture", "OUTBOX_CAPTURE", "capture", CAPTURE,
            "where new messages are found: 'table' claims them from the outbox table; "
            "'logical' reads them from PostgreSQL's log (outbox-relay capture setup first)"),
    Setting("--capture-slot", "OUTBOX_CAPTURE_SLOT", "capture_slot", SLOT_NAME,
            "the replication slot and publication --capture logical reads",
            commands=RUN | {"capture", "status"}, metavar="NAME"),
    Setting("--circuit-threshold", "OUTBOX_CIRCUIT_THRESHOLD", "circuit.threshold", positive_int,
            "consecutive failures of one resource that open its circuit", metavar="N"),
    Setting("--circuit-cooldown", "OUTBOX_CIRCUIT_COOLDOWN", "circuit.cooldown",
            positive_duration, "first open period; it doubles while the resource keeps failing",
            show=format_duration, metavar="DURATION"),
    Setting("--circuit-max-cooldown", "OUTBOX_CIRCUIT_MAX_COOLDOWN", "circuit.max_cooldown",
            positive_duration, "longest open period", show=format_duration, metavar="DURATION"),
    Setting("--circuit-scope", "OUTBOX_CIRCUIT_SCOPE", "circuit_scope", CIRCUIT_SCOPE,
            "what fails together and shares a circuit: the broker (and vhost), each exchange, "
            "or each exchange and routing key; the same on every relay",
            commands=RUN | {"sql"}),
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
    Setting("--signing-keys", "OUTBOX_SIGNING_KEYS", "signing_keys", keys_text,
            "sign every message in the Standard Webhooks scheme with these secrets (whsec_ "
            "and base64), separated by commas (each signs: add the new one, later drop the old); "
            "prefer the variable, since a command line is visible to other users",
            show=lambda _: "unsigned", metavar="SECRETS", secret=True, blank_refused=True),
    Setting("--signing-keys-file", "OUTBOX_SIGNING_KEYS_FILE", "signing_keys_file",
            signing_keys_file, "a TOML file of signing secrets per exchange, with an optional "
            "default for the others (see the Signed messages guide)", show=_none_text,
            metavar="FILE", secret=True),
    Setting("--topology", "OUTBOX_TOPOLOGY", "topology", topology_file,
            "a TOML file of exchanges and queues to declare before publishing (see the "
            "Topology guide)", show=_none_text, metavar="FILE"),
)  # fmt: skip


def settings_for(command: str) -> tuple[Setting, ...]:
    """The settings only `command` has flags for (the global options aside)."""
    return tuple(s for s in SETTINGS if not s.everywhere and s.used_by(command))


def resolve(command: str, flags: Mapping[str, Any], environ: Mapping[str, str]) -> RelayConfig:
    """The configuration `command` runs with.

    `flags` holds the values argparse read, by dest (None: not given). Each setting takes its
    flag, else its variable (an empty one counts as unset), else RelayConfig's default; a flag
    under an old name (Setting.replaced) beats a variable under the new one, and the new name
    beats the old one when both are flags or both variables. A command reads only the variables
    of the settings it uses, so a bad one it ignores stops nothing.
    """
    values: dict[str, Any] = {}
    for setting in SETTINGS:  # the new name comes first in SETTINGS: it wins
        if setting.target and setting.target not in values and flags.get(setting.dest) is not None:
            value = flags[setting.dest]
            if setting.many is not None:
                if len(value) > 1:
                    values[setting.many] = tuple(value)
                value = value[0]
            values[setting.target] = value
    for setting in SETTINGS:
        if flags.get(setting.dest) is None and _from_env(setting, command, environ):
            value = setting.from_env(environ[setting.env or ""])  # checked even when unused
            if setting.target and setting.target not in values:
                values[setting.target] = value
    return build(values)


def replaced(command: str, flags: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """What to say of each old option `command` was given (see Setting.replaced), and whether
    the new name's value was taken instead of it (resolve's order)."""
    said = []
    for old in SETTINGS:
        if old.replaced is None:
            continue
        old_flag = flags.get(old.dest) is not None
        if not old_flag and not _from_env(old, command, environ):
            continue
        text = old.replaced
        new = next((s for s in SETTINGS if s.target == old.target and s.replaced is None), None)
        if old.target and new is not None:
            if flags.get(new.dest) is not None:
                text += f" ({old.flag if old_flag else old.env} is ignored: {new.flag} was given)"
            elif not old_flag and _from_env(new, command, environ):
                text += f" ({old.env} is ignored: {new.env} was given)"
        said.append(text)
    return said


def _from_env(setting: Setting, command: str, environ: Mapping[str, str]) -> bool:
    """Whether `command` takes this setting from its variable."""
    return bool(setting.env) and setting.used_by(command) and _given(setting, environ)


def _given(setting: Setting, environ: Mapping[str, str]) -> bool:
    assert setting.env is not None
    if setting.blank_refused:
        # Set but empty is a mistake to say (a secret that did not arrive), not "unsigned".
        return setting.env in environ
    return bool(environ.get(setting.env, "").strip())


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
