"""What the CLI prints about what it was given: bounded values, masked secrets, plain broker
errors, escaped control characters."""

from __future__ import annotations

import datetime as dt

import pytest

from relay.core.durations import parse_duration, parse_moment
from relay.core.urls import redact, secrets_of
from relay.errors import ConfigError, plain_broker_error
from relay.runtime.logs import one_line, printable
from relay.runtime.readers import positive_int, positive_number
from relay.runtime.urls import parse_amqp_url, parse_db_url

NOW = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)


@pytest.mark.parametrize("text", ["99999999d", "9" * 400, "9999999999999d", "101w" * 1])
def test_durations_past_100_years_are_refused(text: str) -> None:
    if text == "101w":
        assert parse_duration(text) == 101 * 604800  # two years: fine
        return
    with pytest.raises(ValueError, match="longer than 100 years"):
        parse_duration(text)
    with pytest.raises(ValueError, match="longer than 100 years"):
        parse_moment(text, NOW)


def test_moments_at_the_calendars_edge_are_refused() -> None:
    with pytest.raises(ValueError, match="neither a duration"):
        parse_moment("0001-01-01T00:00+05:00", NOW)
    assert parse_moment("2026-11-22T08:00+01:00", NOW) == dt.datetime(
        2026, 11, 22, 7, tzinfo=dt.UTC
    )


@pytest.mark.parametrize(
    ("read", "text"),
    [(positive_int, "99999999999999999999"), (positive_int, "9" * 5000),
     (positive_number, "1e300"), (positive_number, "inf"), (positive_number, "nan")],
)  # fmt: skip
def test_numbers_are_bounded(read: object, text: str) -> None:
    with pytest.raises(ValueError, match=r"too large|not an? (finite )?(number|integer)"):
        read(text)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("query", "named"),
    [("heartbeat=abc", "heartbeat"), ("frame_max=1", "frame_max"), ("nosuch=1", "nosuch"),
     ("channel_max=0", "channel_max"), ("ssl_options=[", "ssl_options"),
     ("heartbeat=1&heartbeat=2", "heartbeat")],
)  # fmt: skip
def test_amqp_url_parameters_pika_would_refuse_are_named(query: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named) as caught:
        parse_amqp_url(f"amqp://u:hunter22@h/%2F?{query}")
    assert "hunter22" not in str(caught.value)


def test_good_amqp_url_parameters_pass() -> None:
    parse_amqp_url("amqp://u:p@h/%2F?heartbeat=30&frame_max=131072&ssl_options={}")


def test_a_database_port_that_is_not_a_number_is_named_without_the_password() -> None:
    with pytest.raises(ConfigError, match="invalid port") as caught:
        parse_db_url("postgresql://u:hunter22@h:notaport/x")
    assert "hunter22" not in str(caught.value)


def test_redact_leaves_a_url_without_secrets_as_written() -> None:
    assert redact("sqlite:///outbox.db") == "sqlite:///outbox.db"
    assert redact("postgresql://u:p%40ss@h/x?password=abc") == "postgresql://u:***@h/x?password=***"


def test_secrets_are_masked_in_every_form_and_in_quoted_urls() -> None:
    secrets = secrets_of("postgresql://u:p%40ssword@h/x", "amqp://h/?password=tok3n")
    text = "failed: p@ssword, p%40ssword, tok3n; tried amqp://a:other-pw@h/"
    line = one_line(text, secrets)
    for secret in ("p@ssword", "p%40ssword", "tok3n", "other-pw"):
        assert secret not in line


def test_one_line_is_one_printable_line() -> None:
    assert one_line("a\nb\x1b[2K\tc") == "a b\\x1b[2K c"
    assert len(one_line("x" * 5000)) <= 600
    assert printable("k\u202ey\n", keep="\n") == "k\\u202ey\n"


@pytest.mark.parametrize(
    ("pika", "meaning"),
    [
        ("AMQPConnectionError: (AMQPConnectionWorkflowFailed: 1 exceptions in all; last exception "
         "- AMQPConnectorSocketConnectError: ConnectionRefusedError(111, 'Connection refused'); "
         "first exception - None,)", "connection refused"),
        ("AMQPConnectionWorkflowFailed: 1 exceptions in all; last exception - gaierror(-2, 'Name "
         "or service not known'); first exception - None", "does not resolve"),
        ("ConnectionClosedByBroker: (403) 'ACCESS_REFUSED - Login was refused'", "login refused"),
        ("ConnectionClosedByBroker: (530) 'NOT_ALLOWED - vhost x not found'", "virtual host"),
    ],
)  # fmt: skip
def test_broker_errors_say_what_they_mean(pika: str, meaning: str) -> None:
    text = plain_broker_error(f"cannot connect to broker amqp://h/: connection failed: {pika}")
    assert text.startswith("cannot connect to broker amqp://h/: ")
    assert meaning in text
    assert "exceptions in all" not in text
