"""Rows' new values decided in Python, as one statement writes them back: a lease taken back
(relay/store/rescuer.py, from relay/core/suspects.py) and, where settling takes several
statements, a settlement (relay/store/stepwise.py, from relay/core/policy.py).

Each dialect's transition_rows and record_attempts read them from one JSON array bound as text
(:rows, :records): PostgreSQL through json_to_recordset, MySQL through JSON_TABLE, SQLite through
json_each. One bind whatever the number of rows, so the statement's text never changes. Times are
UTC, written 'YYYY-MM-DD HH:MM:SS.ffffff' (what MySQL's DATETIME(6) reads, and SQLite stores);
UUIDs are their 32 hex digits; a value that is None is left out (NULL in every dialect).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Transition:
    """A row's new values, written only while it is still in flight under the lease it was read
    with (`token`). The lease is cleared and last_failed_at is the statement's time."""

    seq: int
    token: uuid.UUID
    state: str
    attempts: int
    last_error: str | None
    suspect: str | None  # outbox.states.Suspect's value, or None: not a suspect
    available_at: dt.datetime | None = None  # None: as it is
    keep_expiry: bool = False  # lease_expires_at stays (a pending suspect's mark for schema 6)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One outbox_attempt row; its time is the statement's, its relay the statement's :relay_id."""

    message_id: uuid.UUID
    attempt: int
    failure_class: str
    outcome: str
    error: str | None
    next_at: dt.datetime | None


def as_json(values: Iterable[Transition | Attempt]) -> str:
    """A JSON array of `values` as the statements read it (see the module's docstring)."""
    return json.dumps([_plain(asdict(value)) for value in values])


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, uuid.UUID):
            value = value.hex
        elif isinstance(value, dt.datetime):
            value = utc_text(value)
        out[name] = value
    return out


def utc_text(value: dt.datetime) -> str:
    """A time as its UTC digits (a naive one is taken as UTC: SQLite and MySQL return them)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")
