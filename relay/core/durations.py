"""Durations and points in time as operators type them: `90`, `30s`, `15m`, `2h`, `7d`,
or an ISO 8601 timestamp."""

from __future__ import annotations

import datetime as dt
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
# The longest duration accepted: anything longer is a typo, and would overflow a datetime
# (now - 99999999d), a wait (threading's TIMEOUT_MAX) or a database interval.
MAX_SECONDS = 100 * 365 * 86400.0
MAX_TEXT = "100 years"


def parse_duration(text: str) -> float:
    """Seconds in `text`, at most MAX_SECONDS; raise ValueError naming the accepted forms."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (use e.g. 90, 30s, 15m, 2h, 7d)")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not seconds <= MAX_SECONDS:  # `not <=`: 400 digits read as inf
        raise ValueError(f"{text!r} is longer than {MAX_TEXT}")
    return seconds


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
    """A point in time (UTC): a duration means that long before `now`; otherwise ISO 8601 (UTC if
    no offset is given). ValueError names the problem."""
    if _DURATION.match(text):
        return now - dt.timedelta(seconds=parse_duration(text))
    try:
        moment = dt.datetime.fromisoformat(text)
        # Normalised here, so a moment at the edge of the calendar (0001-01-01T00:00+05:00)
        # fails now, not when a query binds it.
        return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
    except (ValueError, OverflowError):
        raise ValueError(
            f"{text!r} is neither a duration (2h, 7d) nor an ISO timestamp (2026-11-22T08:00)"
        ) from None
