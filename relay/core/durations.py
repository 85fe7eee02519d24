"""Durations and points in time as operators type them: `90`, `30s`, `15m`, `2h`, `7d`,
or an ISO 8601 timestamp."""

from __future__ import annotations

import datetime as dt
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in `text`; raise ValueError naming the accepted forms."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (use e.g. 90, 30s, 15m, 2h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def positive_duration(text: str) -> float:
    """A duration longer than zero, in seconds; ValueError otherwise."""
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return value


def format_duration(seconds: float) -> str:
    """The shortest form parse_duration reads back: 604800 -> '7d', 90 -> '90s', 0.5 -> '500ms'."""
    # Weeks are left out: "7d" is how people say a week of retention.
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _UNITS[unit]
        if count >= 1 and count == round(count):
            return f"{round(count)}{unit}"
    return f"{seconds:g}s"


def parse_moment(text: str, now: dt.datetime) -> dt.datetime:
    """A point in time: a duration means that long before `now`; otherwise ISO 8601 (UTC if no
    offset is given)."""
    try:
        return now - dt.timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (2h, 7d) nor an ISO timestamp (2026-11-22T08:00)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
