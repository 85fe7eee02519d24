"""Each value's rule is written once, in its reader (relay/runtime/readers.py): the settings table
reads a flag's text with it, and RelayConfig checks a value given in code by the same rule; only
the rules between fields are RelayConfig's own."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from relay.core.circuit import CircuitSettings
from relay.core.policy import RetryPolicy
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.runtime.readers import non_negative_number, port, positive_int, positive_number
from relay.runtime.settings import SETTINGS

RULES = {
    f.name: f.metadata["rule"] for f in dataclasses.fields(RelayConfig) if "rule" in f.metadata
}


def test_a_field_with_a_rule_is_read_by_the_reader_that_holds_it() -> None:
    read = {s.target: s.read for s in SETTINGS}
    shared = [name for name in RULES if name in read]
    assert len(shared) >= 15
    for name in shared:
        assert read[name] is RULES[name], name


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("claim_max", 0, "claim_max must be positive, got 0"),
        ("max_in_flight", 2**31, "max_in_flight is too large"),
        ("poll_interval", float("inf"), "poll_interval is not a finite number"),
        ("min_poll_interval", 0.0, "min_poll_interval must be positive"),
        ("drain_timeout", -1.0, "drain_timeout must not be negative"),
        ("batch_life", 0.0, "batch_life must be positive"),
        ("http_port", 70000, "http_port is not a port number (0 to 65535)"),
        ("log_level", "debug", "log_level must be one of DEBUG, INFO"),
        ("dead_key", "drop", "dead_key must be one of hold, skip, not 'drop'"),
        ("circuit_scope", "queue", "circuit_scope must be one of"),
        ("rate_limits", {"orders": 0.0}, "rate limit for 'orders' must be positive"),
        ("db_url", "nonsense", "--db: cannot parse the database URL"),
        ("amqp_url", "http://u:hunter2@h/", "--amqp: 'http://u:***@h/' is not an AMQP URL"),
    ],
)
def test_a_value_given_in_code_keeps_its_readers_rule(field: str, value: Any, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RelayConfig(**{field: value})
    assert words in str(refused.value)
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("read", "text", "field", "value", "problem"),
    [
        (positive_int, "0", "max_in_flight", 0, "must be positive"),
        (positive_number, "-2", "lease_seconds", -2.0, "must be positive"),
        (non_negative_number, "-1", "drain_timeout", -1.0, "must not be negative"),
        (port, "65536", "http_port", 65536, "is not a port number (0 to 65535)"),
    ],
)
def test_the_flag_and_the_field_say_the_same_problem(
    read: Any, text: str, field: str, value: Any, problem: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(f"{text!r} {problem}")):
        read(text)
    with pytest.raises(ConfigError, match="^" + re.escape(f"{field} {problem}, got")):
        RelayConfig(**{field: value})


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"heartbeat_interval": 2.0, "dead_after": 5.0}, "at least 3 x heartbeat_interval"),
        ({"lease_seconds": 10.0, "confirm_timeout": 10.0}, "lease_seconds (10.0) must be longer"),
        ({"batch_life": 20.0}, "max batch life (20) must be longer than confirm_timeout"),
        ({"policy": RetryPolicy(floor=5.0, cap=1.0)}, "backoff needs 0 < floor"),
        ({"circuit": CircuitSettings(cooldown=60.0, max_cooldown=30.0)}, "must not be longer"),
        ({"circuit": CircuitSettings(probe_timeout=5.0)}, "circuit probe timeout (5) must be"),
    ],
)
def test_the_rules_between_fields_are_relay_configs_own(values: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RelayConfig(**values)
    assert words in str(refused.value)


def test_the_defaults_keep_every_rule() -> None:
    config = RelayConfig()
    for name, rule in RULES.items():
        value = getattr(config, name)
        if value is not None:
            rule.check(name, value)
