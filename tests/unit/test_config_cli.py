"""Configuration validation and the CLI's usage errors: exit 2 with one line, no traceback."""

from __future__ import annotations

import pytest

from relay.cli import main as cli
from relay.cli.schema import format_status
from relay.core.urls import redact
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.runtime.urls import parse_amqp_url, parse_db_url


@pytest.mark.parametrize(
    "url",
    ["nonsense", "oracle://u@h/db", "postgresql+asyncpg://u@h/db", "://"],
)
def test_bad_db_urls_name_the_problem(url: str) -> None:
    with pytest.raises(ConfigError, match="--db"):
        parse_db_url(url)


def test_plain_postgresql_url_means_psycopg() -> None:
    # Explicit, or SQLAlchemy's own default where that is already psycopg 3 (2.1 and later).
    assert parse_db_url("postgresql://u@h/db").get_driver_name() == "psycopg"
    assert parse_db_url("sqlite:///x.db").get_backend_name() == "sqlite"


@pytest.mark.parametrize("url", ["http://h/", "amqp://", "amqp://h:notaport/", "localhost:5672"])
def test_bad_amqp_urls_name_the_problem(url: str) -> None:
    with pytest.raises(ConfigError, match="--amqp"):
        parse_amqp_url(url)


def test_passwords_are_redacted() -> None:
    assert redact("amqp://guest:secret@h:5672/%2F") == "amqp://guest:***@h:5672/%2F"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    # libpq takes the password in the query too.
    assert redact("postgresql://u@h/db?password=s3cret&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )
    assert "s3cret" not in redact("postgresql://u:s3cret@h/db?PASSWORD=s3cret")


def test_config_rejects_a_lease_shorter_than_the_confirm_timeout() -> None:
    with pytest.raises(ConfigError, match="lease_seconds"):
        RelayConfig(lease_seconds=5, confirm_timeout=10)


def test_config_rejects_non_positive_values() -> None:
    with pytest.raises(ConfigError, match="claim_max"):
        RelayConfig(claim_max=0)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--bogus", "status"], "unrecognized arguments"),
        ([], "required"),
        (["run", "--batch-size", "0"], "must be positive"),
        (["run", "--poll-interval", "soon"], "is not a number"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert words in err


@pytest.mark.parametrize(
    "argv",
    [["--db", "nonsense://", "status"], ["--amqp", "http://x", "status"]],
)
def test_bad_urls_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_status_table_is_readable() -> None:
    report: dict[str, float | int | None] = {
        "pending": 3, "ready": 2, "delayed": 1, "in_flight": 0, "published": 10,
        "dead": 0, "cancelled": 0, "discarded": 0, "oldest_pending_age_s": 1.25,
    }  # fmt: skip
    text = format_status(report)
    assert "3 (2 ready, 1 delayed)" in text
    assert "1.2 s" in text
