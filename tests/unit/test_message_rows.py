"""The one message filter and the one row formatter the command line and the console share
(relay/runtime/message_filter.py, relay/runtime/message_rows.py): the same input makes the same
filter and the same cells in both, and a bad filter is named as each spells it."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from relay.cli import main as cli
from relay.cli.messages import _COLUMNS, _WIDTHS, _filter
from relay.console.filters import BadRequest, message_filter
from relay.errors import ConfigError
from relay.runtime import message_filter as filters
from relay.runtime.message_rows import cell, jsonable, message_cells
from relay.store.admin import MessageFilter

NOW = dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.UTC)
PLUS_ONE = dt.timezone(dt.timedelta(hours=1))


def cli_filter(*argv: str) -> MessageFilter:
    return _filter(cli.build_parser().parse_args(["messages", *argv]), NOW)


def test_the_command_line_and_the_console_read_the_same_filter() -> None:
    from_cli = cli_filter(
        "--state", "dead,pending", "--state", "dead", "--exchange", "", "--routing-key", "o.*",
        "--key", "k1", "--created-since", "2h", "--failed-until", "2026-11-23T07:00",
        "--error-contains", "NO_ROUTE",
    )  # fmt: skip
    from_console = message_filter(
        {"state": ["dead,pending", "dead"], "exchange": [""], "routing_key": ["o.*"],
         "key": ["k1"], "created_since": ["2h"], "failed_until": ["2026-11-23T07:00"],
         "error_contains": ["NO_ROUTE"]},
        NOW,
    )  # fmt: skip
    assert from_cli == from_console
    assert from_cli.states == ["dead", "pending"]
    assert from_cli.exchange == ""  # the default exchange, not "any"
    assert from_cli.created_since == NOW - dt.timedelta(hours=2)
    assert from_cli.failed_until == dt.datetime(2026, 11, 23, 7, 0, tzinfo=dt.UTC)
    assert cli_filter() == message_filter({}, NOW) == MessageFilter(states=[])


def test_a_bad_filter_is_named_as_each_caller_spells_it() -> None:
    with pytest.raises(filters.FilterError) as shared:
        filters.message_filter({"failed_since": ["yesterday"]}, NOW)
    assert (shared.value.name, shared.value.problem.split(" is ")[0]) == (
        "failed_since",
        "'yesterday'",
    )
    with pytest.raises(BadRequest, match=r"^failed_since: 'yesterday' is neither a duration"):
        message_filter({"failed_since": ["yesterday"]}, NOW)
    with pytest.raises(ConfigError, match=r"^--failed-since: 'yesterday' is neither a duration"):
        cli_filter("--failed-since", "yesterday")
    with pytest.raises(BadRequest, match=r"^state: unknown state 'zombie' "):
        message_filter({"state": ["dead,zombie"]}, NOW)
    with pytest.raises(BadRequest, match=r"^exchange is given 2 times$"):
        message_filter({"exchange": ["a", "b"]}, NOW)


def test_the_command_lines_state_flag_names_every_unknown_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["messages", "--state", "zombie,dead,ghost"]) == 2
    assert "unknown state zombie, ghost (known: pending," in capsys.readouterr().err
    assert cli.main(["messages", "--state", ","]) == 2
    assert "unknown state ',' (known:" in capsys.readouterr().err


ROW = {
    "id": uuid.UUID("5a1c8e59-7d6e-4a55-9a3f-0c5a3b8a6a01"),
    "state": "dead",
    "attempts": 3,
    "exchange": "orders\x1b[2K",
    "routing_key": "order.created." + "x" * 40,
    "key": None,
    "priority": 0,
    "created_at": dt.datetime(
        2026, 11, 23, 9, 0, 5, 123, tzinfo=dt.timezone(dt.timedelta(hours=1))
    ),
    "available_at": None,
    "last_error": "NO_ROUTE\n  312 \u202eback",
    "payload": b"{}",
}


def test_a_row_is_written_once_for_both() -> None:
    cells = message_cells(ROW, _WIDTHS)
    assert cells == {
        "id": "5a1c8e59-7d6e-4a55-9a3f-0c5a3b8a6a01",
        "state": "dead",
        "attempts": "3",
        "exchange": "orders\\x1b[2K",  # acts on no terminal and no page
        "routing_key": "order.created.xxxxxxxxx…",  # 24 characters on a terminal
        "key": "-",
        "priority": "0",
        "created": "2026-11-23 08:00:05",  # UTC, to the second
        "due": "-",
        "last_error": "NO_ROUTE 312 \\u202eback",  # one line
    }
    assert set(_COLUMNS) <= set(cells)
    assert message_cells(ROW, {"last_error": 90})["routing_key"] == ROW["routing_key"]
    assert cell(None) == "-"
    assert cell("a\tb", 10) == "a b"


def test_json_rows_are_the_same_for_both() -> None:
    out = jsonable(ROW)
    assert out["id"] == str(ROW["id"])
    assert out["created_at"] == "2026-11-23T08:00:05.000123+00:00"
    assert out["payload"] is None  # bytes are left out
