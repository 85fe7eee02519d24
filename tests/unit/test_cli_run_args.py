"""`run`'s flags reach the configuration the relay is built with."""

from __future__ import annotations

import pytest

from relay.cli import main as cli
from relay.cli.options import configure
from relay.core.failures import FailureClass
from relay.runtime.config import RelayConfig


def _config(argv: list[str]) -> RelayConfig:
    return configure(cli.build_parser().parse_args(argv), {})


def test_run_flags_build_the_retry_policy() -> None:
    config = _config(
        ["run", "--max-attempts", "4", "--max-attempts-for", "audit=9", "--max-age", "2h",
         "--backoff-base", "2s", "--backoff-cap", "10m", "--permanent", "malformed"]
    )  # fmt: skip
    policy = config.policy
    assert policy.max_attempts == 4
    assert dict(policy.max_attempts_by_exchange) == {"audit": 9}
    assert policy.max_age == 7200
    assert (policy.base, policy.cap) == (2, 600)
    assert policy.permanent == frozenset({FailureClass.MALFORMED})


def test_run_defaults() -> None:
    policy = _config(["run"]).policy
    assert policy.max_attempts == 10
    assert FailureClass.UNROUTABLE in policy.permanent


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--permanent", "sometimes"], "unknown failure class"),
        (["run", "--max-attempts-for", "audit"], "EXCHANGE=N"),
        (["run", "--max-age", "forever"], "not a duration"),
    ],
)
def test_bad_run_flags_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert words in capsys.readouterr().err


def test_circuit_and_rate_limit_flags() -> None:
    config = _config(
        ["run", "--circuit-threshold", "7", "--circuit-cooldown", "2s",
         "--circuit-max-cooldown", "1m", "--circuit-scope", "routing_key",
         "--rate-limit", "orders=25", "--rate-limit", "audit=0.5,mail=3"]
    )  # fmt: skip
    c = config.circuit
    assert (c.threshold, c.cooldown, c.max_cooldown) == (7, 2, 60)
    assert c.probe_timeout > config.confirm_timeout
    assert config.circuit_scope == "routing_key"
    assert dict(config.rate_limits) == {"orders": 25.0, "audit": 0.5, "mail": 3.0}


def test_circuit_defaults() -> None:
    config = _config(["run"])
    assert (config.circuit.threshold, config.circuit.cooldown) == (5, 5.0)
    assert config.circuit_scope == "exchange"
    assert config.rate_limits == {}
    assert FailureClass.DESTINATION_MISSING not in config.policy.permanent


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--rate-limit", "orders"], "RESOURCE=RATE"),
        (["run", "--rate-limit", "orders=0"], "RESOURCE=RATE"),
        (["run", "--circuit-scope", "queue"], "is not one of broker, exchange, routing_key"),
        (["run", "--circuit-threshold", "0"], "must be positive"),
    ],
)
def test_bad_circuit_flags_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert words in capsys.readouterr().err


def test_a_cooldown_longer_than_its_maximum_is_a_configuration_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["run", "--circuit-cooldown", "10m", "--circuit-max-cooldown", "1m"])
    assert code == 2
    assert "circuit cooldown" in capsys.readouterr().err
