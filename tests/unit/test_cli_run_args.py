"""`run`'s flags reach the configuration the relay is built with."""

from __future__ import annotations

import pytest

from relay import cli
from relay.config import RelayConfig
from relay.core.failures import FailureClass


def _config(argv: list[str]) -> RelayConfig:
    return cli._config(cli.build_parser().parse_args(argv))


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
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err
