"""Which messages an operator means: the filters of `outbox-relay messages` (and of replay,
discard, reschedule and prioritize) and of the console's pages and API, read here, once, into the
store's MessageFilter.

Each caller names a filter its own way (`--created-since` on the command line, `created_since`
in a query string), so a filter that cannot be read raises FilterError with the filter's name
apart from the problem, and the caller puts the two together.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

from outbox.states import State
from relay.core.durations import parse_moment
from relay.store.admin import MessageFilter

# Matched exactly (error_contains: contained in the last error; error_group: its first
# characters, see admin.failure_groups).
TEXT_FILTERS = ("exchange", "routing_key", "key", "error_contains", "error_group")
# A duration ago (2h, 7d) or an ISO timestamp.
TIME_FILTERS = ("created_since", "created_until", "failed_since", "failed_until")
# `no_error=true`: only messages without a last error (what a failure group of NULLs holds).
NO_ERROR = "no_error"
FILTERS = ("state", *TEXT_FILTERS, *TIME_FILTERS, NO_ERROR)
KNOWN_STATES = tuple(s.value for s in State)


class FilterError(ValueError):
    """A filter that cannot be read: `name` is the filter's (as in FILTERS), `problem` what is
    wrong; the message says both, the filter named as in a query string."""

    def __init__(self, name: str, problem: str, message: str | None = None) -> None:
        super().__init__(message or f"{name}: {problem}")
        self.name = name
        self.problem = problem


class UnknownState(FilterError):
    """States no message can be in; `unknown` lists them as given."""

    def __init__(self, unknown: Sequence[str]) -> None:
        super().__init__(
            "state", f"unknown state {unknown[0]!r} (known: {', '.join(KNOWN_STATES)})"
        )
        self.unknown = tuple(unknown)


def states(values: Iterable[str]) -> list[str]:
    """The states named in `values`, each comma-separated, each state once, in order."""
    names = [s.strip() for v in values for s in v.split(",") if s.strip()]
    unknown = [n for n in names if n not in KNOWN_STATES]
    if unknown:
        raise UnknownState(unknown)
    return list(dict.fromkeys(names))


def message_filter(values: Mapping[str, Sequence[str]], now: dt.datetime) -> MessageFilter:
    """The filter `values` (by the names in FILTERS) describe; times relative to `now`. A name
    not in FILTERS is the caller's to refuse; an empty text ("") is a value (the default
    exchange's name)."""

    def one(name: str) -> str | None:
        given = values.get(name)
        if not given:
            return None
        if len(given) > 1:
            times = f"is given {len(given)} times"
            raise FilterError(name, times, f"{name} {times}")
        return given[0]

    def when(name: str) -> dt.datetime | None:
        raw = one(name)
        if raw is None:
            return None
        try:
            return parse_moment(raw, now)
        except ValueError as exc:
            raise FilterError(name, str(exc)) from None

    text = {name: one(name) for name in TEXT_FILTERS}
    no_error = one(NO_ERROR)
    if no_error not in (None, "true"):
        raise FilterError(NO_ERROR, f"{no_error!r} is not true (leave it out for any error)")
    return MessageFilter(
        states=states(values.get("state", ())),
        exchange=text["exchange"],
        routing_key=text["routing_key"],
        key=text["key"],
        error_contains=text["error_contains"],
        error_group=text["error_group"],
        no_error=no_error == "true",
        created_since=when("created_since"),
        created_until=when("created_until"),
        failed_since=when("failed_since"),
        failed_until=when("failed_until"),
    )
