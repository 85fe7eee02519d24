"""The settings table through the CLI: flag over variable over default, read after argparse, so a
bad variable is named (exit 2, one line) and stops only the commands that read it; global options
before or after the command; --version; --help shows no password."""

from __future__ import annotations

import os
from importlib.metadata import version

import pytest

from outbox.schema import SCHEMA_VERSION
from relay.cli import main as cli
from relay.cli.options import configure, replaced_options
from relay.core.durations import format_duration, parse_duration
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.runtime.settings import SETTINGS, resolve

DB = "sqlite:///elsewhere.db"
AMQP = "amqp://relay:pw@broker.example:5672/orders"


@pytest.fixture(autouse=True)
def no_outbox_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets."""
    for name in [n for n in os.environ if n.startswith("OUTBOX_")]:
        monkeypatch.delenv(name)


def config(argv: list[str], **environ: str) -> RelayConfig:
    return configure(cli.build_parser().parse_args(argv), environ)


# --------------------------------------------------------------------------- precedence


def test_a_flag_beats_its_variable_which_beats_the_default() -> None:
    assert config(["run"]).max_in_flight == 2048
    assert config(["run"], OUTBOX_MAX_IN_FLIGHT="7").max_in_flight == 7
    assert config(["run", "--max-in-flight", "9"], OUTBOX_MAX_IN_FLIGHT="7").max_in_flight == 9
    assert config(["run"], OUTBOX_MAX_IN_FLIGHT="").max_in_flight == 2048  # empty is unset


def test_the_old_flow_control_options_are_accepted_and_say_what_replaced_them() -> None:
    """One limit: --max-unconfirmed is its old name (the new one wins when both are given);
    --batch-size has no effect. Each is named once in a warning."""
    assert config(["run", "--max-unconfirmed", "300"]).max_in_flight == 300
    assert config(["run"], OUTBOX_MAX_UNCONFIRMED="300").max_in_flight == 300
    both = ["run", "--max-in-flight", "900", "--max-unconfirmed", "300"]
    assert config(both).max_in_flight == 900
    assert config(["run", "--batch-size", "9"]).claim_max == RelayConfig().claim_max
    args = cli.build_parser().parse_args(["run", "--batch-size", "9", "--max-unconfirmed", "3"])
    said = replaced_options(args, {})
    assert len(said) == 2
    assert "--max-unconfirmed is --max-in-flight now" in said[0]
    assert said[1].startswith("--batch-size has no effect")
    assert replaced_options(cli.build_parser().parse_args(["run"]), {}) == []


def test_a_flag_under_the_old_name_beats_the_new_names_variable() -> None:
    """A flag wins over a variable whatever the names; between two flags or two variables, the
    new name wins, and the warning says the old one's value was ignored."""
    old_flag = ["run", "--max-unconfirmed", "300"]
    assert config(old_flag, OUTBOX_MAX_IN_FLIGHT="7").max_in_flight == 300
    assert (
        config(["run"], OUTBOX_MAX_IN_FLIGHT="7", OUTBOX_MAX_UNCONFIRMED="300").max_in_flight == 7
    )
    parse = cli.build_parser().parse_args
    [said] = replaced_options(parse(old_flag), {"OUTBOX_MAX_IN_FLIGHT": "7"})
    assert "ignored" not in said
    both = {"OUTBOX_MAX_IN_FLIGHT": "7", "OUTBOX_MAX_UNCONFIRMED": "300"}
    [said] = replaced_options(parse(["run"]), both)
    assert said.endswith("(OUTBOX_MAX_UNCONFIRMED is ignored: OUTBOX_MAX_IN_FLIGHT was given)")
    [said] = replaced_options(parse(["run", "--max-in-flight", "9", "--max-unconfirmed", "3"]), {})
    assert said.endswith("(--max-unconfirmed is ignored: --max-in-flight was given)")


def test_variables_reach_every_part_of_the_configuration() -> None:
    c = config(
        ["run"], OUTBOX_MAX_AGE="2h", OUTBOX_RETAIN_PUBLISHED="forever", OUTBOX_LISTEN="off",
        OUTBOX_CIRCUIT_COOLDOWN="2s", OUTBOX_RATE_LIMITS="orders=5,audit=0.5",
        OUTBOX_PERMANENT="none", OUTBOX_CONFIRM_TIMEOUT="25", OUTBOX_LOG_LEVEL="debug",
    )  # fmt: skip
    assert c.policy.max_age == 7200
    assert c.retention is not None
    assert c.retention.published_after is None
    assert c.listen is False
    assert c.circuit.cooldown == 2
    assert dict(c.rate_limits) == {"orders": 5.0, "audit": 0.5}
    assert c.policy.permanent == frozenset()
    assert c.circuit.probe_timeout > c.confirm_timeout == 25
    assert c.log_level == "DEBUG"


def test_repeated_flags_replace_the_variable_and_add_up() -> None:
    argv = ["run", "--rate-limit", "a=1", "--rate-limit", "b=2,a=3"]
    assert dict(config(argv, OUTBOX_RATE_LIMITS="c=9").rate_limits) == {"a": 3.0, "b": 2.0}


def test_no_flag_and_no_variable_is_relay_configs_own_default() -> None:
    resolved = resolve("run", {}, {})
    assert resolved == RelayConfig(relay_id=resolved.relay_id)


def test_another_commands_option_with_the_same_name_is_not_a_setting() -> None:
    purge = config(["purge", "--older-than", "1d", "--batch-size", "5000"])
    assert purge.max_in_flight == RelayConfig().max_in_flight
    args = cli.build_parser().parse_args(["purge", "--older-than", "1d", "--batch-size", "50"])
    assert replaced_options(args, {}) == []


# --------------------------------------------------------------------------- bad variables


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("OUTBOX_BATCH_SIZE", "abc", "OUTBOX_BATCH_SIZE='abc' is not an integer"),
        ("OUTBOX_BATCH_SIZE", "0", "OUTBOX_BATCH_SIZE='0' must be positive"),
        ("OUTBOX_POLL_INTERVAL", "soon", "OUTBOX_POLL_INTERVAL='soon' is not a number"),
        ("OUTBOX_MAX_AGE", "a week", "OUTBOX_MAX_AGE='a week' is not a duration"),
        ("OUTBOX_LISTEN", "maybe", "OUTBOX_LISTEN='maybe' is not on or off"),
        ("OUTBOX_CIRCUIT_SCOPE", "queue", "OUTBOX_CIRCUIT_SCOPE='queue' is not one of broker"),
        ("OUTBOX_DEAD_KEY", "drop", "OUTBOX_DEAD_KEY='drop' is not one of hold, skip"),
        ("OUTBOX_PERMANENT", "sometimes", "unknown failure class sometimes"),
        ("OUTBOX_RATE_LIMITS", "orders=5,audit", "OUTBOX_RATE_LIMITS='orders=5,audit': 'audit'"),
        ("OUTBOX_HTTP_PORT", "99999", "OUTBOX_HTTP_PORT='99999' is not a port number"),
        ("OUTBOX_LOG_LEVEL", "loud", "OUTBOX_LOG_LEVEL='loud' is not one of DEBUG"),
        ("OUTBOX_DB_URL", "nonsense", "OUTBOX_DB_URL: cannot parse the database URL"),
        ("OUTBOX_DB_URL", "oracle://h/db", "OUTBOX_DB_URL: unsupported database 'oracle'"),
        ("OUTBOX_AMQP_URL", "http://h/", "OUTBOX_AMQP_URL: 'http://h/' is not an AMQP URL"),
    ],
)
def test_a_bad_variable_is_named_in_one_line_with_exit_2(
    name: str,
    value: str,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(name, value)
    assert cli.main(["run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("outbox-relay: error: "), captured.err
    assert line in captured.err
    assert len(captured.err.splitlines()) == 1, captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("OUTBOX_AMQP_URL", "http://relay:hunter2@h/", "'http://relay:***@h/' is not an AMQP URL"),
        ("OUTBOX_DB_URL", "oracle://app:hunter2@h/db", "unsupported database 'oracle'"),
        ("OUTBOX_DB_URL", "postgresql+asyncpg://app:hunter2@h/db", "unsupported driver"),
    ],
)
def test_a_bad_url_in_a_variable_is_named_without_its_password(
    name: str,
    value: str,
    words: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(name, value)
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert f"{name}: {words}" in err
    assert "hunter2" not in err


@pytest.mark.parametrize(
    ("command", "environ"),
    [
        (["status"], {"OUTBOX_BATCH_SIZE": "abc", "OUTBOX_AMQP_URL": "http://x"}),
        (["migrate"], {"OUTBOX_CIRCUIT_SCOPE": "queue", "OUTBOX_LISTEN": "maybe"}),
        (["purge", "--older-than", "1d"], {"OUTBOX_HTTP_PORT": "http"}),
        (["demo"], {"OUTBOX_DB_URL": "nonsense"}),
    ],
)
def test_a_bad_variable_a_command_does_not_read_does_not_stop_it(
    command: list[str], environ: dict[str, str]
) -> None:
    config(command, **environ)  # no ConfigError


def test_a_variable_every_command_reads_stops_every_command() -> None:
    with pytest.raises(ConfigError, match="OUTBOX_LOG_LEVEL"):
        config(["status"], OUTBOX_LOG_LEVEL="loud")


def test_a_bad_global_flag_is_refused_even_where_its_variable_would_be_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["migrate", "--amqp", "http://x"]) == 2
    assert "--amqp" in capsys.readouterr().err


# --------------------------------------------------------------------------- global options


@pytest.mark.parametrize(
    "argv",
    [
        ["--db", DB, "--amqp", AMQP, "--log-level", "warning", "run"],
        ["run", "--db", DB, "--amqp", AMQP, "--log-level", "warning"],
        ["--db", DB, "run", "--amqp", AMQP, "--log-level", "warning"],
    ],
)
def test_global_options_go_before_or_after_the_command(argv: list[str]) -> None:
    c = config(argv)
    assert (c.db_url, c.amqp_url, c.log_level) == (DB, AMQP, "WARNING")


@pytest.mark.parametrize(
    "argv",
    [
        ["circuits", "--db", DB],
        ["circuits", "reset", "orders", "--db", DB],
        ["purge", "--older-than", "1d", "--db", DB],
        ["show", "--db", DB, "5a1c8e59-7d6e-4a55-9a3f-0c5a3b8a6a01"],
        ["demo-producer", "--db", DB],
    ],
)
def test_every_command_accepts_the_global_options_after_its_name(argv: list[str]) -> None:
    assert config(argv).db_url == DB


def test_an_option_left_out_after_the_command_keeps_the_one_before_it() -> None:
    assert config(["--db", DB, "status", "--json"]).db_url == DB
    assert config(["--db", "sqlite:///first.db", "status", "--db", DB]).db_url == DB


# --------------------------------------------------------------------------- --version, --help


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    said = capsys.readouterr().out.strip()
    assert said == f"outbox-relay {version('outbox-relay')} (schema {SCHEMA_VERSION})"


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["status", "--help"]])
def test_help_shows_no_password(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OUTBOX_DB_URL", "postgresql+psycopg://app:hunter2@db/app")
    monkeypatch.setenv("OUTBOX_AMQP_URL", "amqp://relay:hunter2@broker/%2F")
    monkeypatch.setenv("OUTBOX_BATCH_SIZE", "abc")  # help reads no variable's value
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "OUTBOX_DB_URL" in out
    assert "hunter2" not in out
    assert "guest:guest" not in out  # the built-in default, redacted too
    assert "guest:***@localhost" in out


def test_help_names_every_variable_of_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for setting in SETTINGS:
        assert setting.flag in out
        if setting.env:
            assert setting.env in out


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(604800.0, "7d"), (3600.0, "1h"), (300.0, "5m"), (90.0, "90s"), (0.5, "500ms"), (1.0, "1s")],
)
def test_durations_are_shown_as_they_are_typed(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
