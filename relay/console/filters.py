"""Query parameters to the store's MessageFilter (read as `outbox-relay messages` reads its
filters: relay/runtime/message_filter.py), and the parameters back into links. A bad or unknown
parameter is a BadRequest naming it."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from relay.runtime.message_filter import FILTERS, TEXT_FILTERS, FilterError
from relay.runtime.message_filter import message_filter as read_filter
from relay.store.admin import MessageFilter

PAGING = ("limit", "before", "after")
# Matched exactly, so "" is a value like any other (message_filter.TEXT_FILTERS).
EXACT = ("exchange", "routing_key", "key", "error_group")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# The longest text filter: a failure group's name is the first 200 characters of an error
# (admin.GROUP_CHARS), and longer needles only make an unindexed scan dearer.
MAX_TEXT = 200

Params = Mapping[str, Sequence[str]]


class BadRequest(ValueError):
    """The request cannot be served as asked; the message says why (HTTP 400)."""


def kept(name: str, values: Sequence[str]) -> list[str]:
    """The values of parameter `name` that say something: "" is a name (the default exchange's)
    for the text filters matched exactly, and nothing for any other parameter."""
    if name in EXACT:
        return list(values)
    return [v for v in values if v.strip()]


def parse_query(query: str) -> dict[str, list[str]]:
    """A query string's parameters, blank values kept only where they are names (`kept`); the
    page's script leaves a form's blank fields out."""
    parsed = urllib.parse.parse_qs(query, keep_blank_values=True)
    return {k: vs for k, vs in ((k, kept(k, vs)) for k, vs in parsed.items()) if vs}


def only(params: Params, allowed: Sequence[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r} (known: {', '.join(allowed)})")


def _one(params: Params, name: str) -> str | None:
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{name} is given {len(values)} times")
    return values[0]


def message_filter(params: Params, now: dt.datetime) -> MessageFilter:
    """The filter `params` describe (other parameters are the caller's to check)."""
    for name, values in params.items():
        for value in values:
            # A NUL reaches no database as text (PostgreSQL refuses it): the request is wrong.
            if "\x00" in value:
                raise BadRequest(f"{name}: contains a NUL character")
            if name in TEXT_FILTERS and len(value) > MAX_TEXT:
                raise BadRequest(f"{name}: at most {MAX_TEXT} characters, not {len(value)}")
    try:
        return read_filter(params, now)
    except FilterError as exc:
        raise BadRequest(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Paging:
    limit: int = DEFAULT_LIMIT
    before: int | None = None
    after: int | None = None


def paging(params: Params) -> Paging:
    def number(name: str, low: int, high: int) -> int | None:
        raw = _one(params, name)
        if raw is None:
            return None
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 19) or not low <= int(raw) <= high:
            raise BadRequest(f"{name}: {raw!r} is not a whole number from {low} to {high}")
        return int(raw)

    limit = number("limit", 1, MAX_LIMIT)
    before, after = number("before", 0, 2**63 - 1), number("after", 0, 2**63 - 1)
    if before is not None and after is not None:
        raise BadRequest("give before or after, not both")
    return Paging(DEFAULT_LIMIT if limit is None else limit, before, after)


def filter_params(params: Params) -> dict[str, list[str]]:
    """The filter parameters of `params`, as given (a relative time stays relative)."""
    return {k: list(v) for k, v in params.items() if k in FILTERS}


def link(path: str, params: Params, **extra: object) -> str:
    """`path` with `params` and `extra` (None left out) as its query string."""
    pairs = [(k, v) for k, vs in params.items() for v in vs]
    pairs += [(k, str(v)) for k, v in extra.items() if v is not None]
    return f"{path}?{urllib.parse.urlencode(pairs)}" if pairs else path


def _shown(values: Sequence[str]) -> str:
    return ",".join(values) if any(values) else '""'  # the default exchange, say


def describe(params: Params) -> str:
    """The filter as a person reads it: `state=dead, exchange=orders` (or `every message`)."""
    parts = [f"{k}={_shown(v)}" for k, v in params.items() if k in FILTERS and v]
    return ", ".join(parts) or "every message"
