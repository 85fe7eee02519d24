"""A message row as operators see it, the same on the command line and in the console: JSON (for
`--json` and the console's API), and text cells (for the command line's tables and the console's
pages), with times in UTC to the second, a missing value as "-", and every control character a
stored exchange, key or error may hold written as an escape (relay.runtime.logs.printable), so
none can act on the terminal or the page that shows it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

from relay.runtime.logs import printable

# A listed message's columns, and the field of the row each shows.
COLUMNS: Mapping[str, str] = {
    "id": "id",
    "state": "state",
    "attempts": "attempts",
    "exchange": "exchange",
    "routing_key": "routing_key",
    "key": "key",
    "priority": "priority",
    "created": "created_at",
    "due": "available_at",
    "last_error": "last_error",
}


def jsonable(value: Any) -> Any:
    """`value` with times as ISO 8601 UTC, ids as text, bytes left out; for json.dumps."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)  # a hand-corrupted row may hold anything


def when(value: Any) -> str:
    """A time as operators read it: UTC, to the second; "-" for none; anything else as text."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if value is None else str(value)


def short(text: Any, width: int = 90) -> str:
    """One line of at most `width` characters (a table cell)."""
    s = "-" if text is None else " ".join(str(text).split())
    return s if len(s) <= width else s[: width - 1] + "…"


def cell(value: Any, width: int | None = None) -> str:
    """`value` as a cell's text, control characters escaped; on one line of at most `width`
    characters when one is given."""
    return printable(when(value) if width is None else short(value, width))


def message_cells(row: Mapping[str, Any], widths: Mapping[str, int]) -> dict[str, str]:
    """The cells of a listed message, by column (COLUMNS); a column in `widths` on one line of at
    most that many characters."""
    return {column: cell(row.get(name), widths.get(column)) for column, name in COLUMNS.items()}
