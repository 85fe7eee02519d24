"""The Python side of relay/store/sql/common.sql: the configuration values the statements take
(blocking states, resource parts), the suspects' stamps bound into them, and the shared texts under
the names the dialects and counting.py use. The SQL itself, and why each statement is written as it
is, is in common.sql; nothing here is a value: every value is bound.
"""

from __future__ import annotations

import string
import uuid
from collections.abc import Mapping
from typing import Any

from relay.core import suspects
from relay.store import queries

_SQL = queries.load("common")

# ------------------------------------------------------------------------ per-key order

# The states that hold a key back, a literal list per dead-key mode (common.sql, blocking_hold):
# {{blocking}} in the statements.
BLOCKING_HOLD = _SQL.text("blocking_hold")
BLOCKING_SKIP = _SQL.text("blocking_skip")


def blocking_states(*, hold: bool) -> str:
    return BLOCKING_HOLD if hold else BLOCKING_SKIP


# ------------------------------------------------------------------------ crash isolation

# The suspects' stamps (relay/core/suspects.py holds the rules), bound into the statements that
# claim, give back and take back rows.
GROUPED = suspects.GROUPED
SOLITARY = suspects.SOLITARY
ALONE = suspects.ALONE


def reason_sql(template: str, **fields: str) -> str:
    """One of relay/core/suspects.py's reason templates as a SQL text expression (||): its
    literal parts quoted, each field the SQL expression given for it. So a statement that takes
    leases back in SQL (postgres.sql's reclaim) writes the core's text."""
    parts: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        if literal:
            parts.append("'" + literal.replace("'", "''") + "'")
        if name is not None:
            parts.append(fields[name])
    return " || ".join(parts)


def reclaim_attempt(
    message_id: uuid.UUID, record: suspects.Record, params: Mapping[str, Any]
) -> dict[str, Any]:
    """The binds of a dialect's RECORD_ATTEMPT for a row taken back (MySQL, SQLite)."""
    return {
        **params,
        "message_id": message_id,
        "attempt": record.attempt,
        "failure_class": "ambiguous",
        "outcome": record.outcome,
        "error": record.error,
        "next_at": record.next_attempt_at,
    }


# ------------------------------------------------------------------------ resources

# How a message row names its part of a resource, per scope (the relay's --circuit-scope; the
# scopes and the full names are relay/core/resources.py's). Computed in the claim's WHERE clause,
# so an excluded resource's rows are passed by inside the index scan.
RESOURCE_PARTS: Mapping[str, str] = {
    "broker": "''",  # one resource per broker endpoint and vhost: coarsest
    "exchange": "exchange",  # the default
    "routing_key": "exchange || '/' || routing_key",  # finest: each exchange + routing key
}
