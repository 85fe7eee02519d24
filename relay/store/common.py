"""The Python side of relay/store/sql/common.sql: the configuration values the statements take
(blocking states, resource parts) and the texts bound beside the suspect column. The SQL itself,
and why each statement is written as it is, is in common.sql; nothing here is a value: every value
is bound.
"""

from __future__ import annotations

from collections.abc import Mapping

from relay.store import queries

_SQL = queries.load("common")

# ------------------------------------------------------------------------ per-key order

# The states that hold a key back, a literal list per dead-key mode (common.sql, blocking_hold):
# {{blocking}} in the statements.
BLOCKING_HOLD = _SQL.text("blocking_hold")
BLOCKING_SKIP = _SQL.text("blocking_skip")


def blocking_states(*, hold: bool) -> str:
    return BLOCKING_HOLD if hold else BLOCKING_SKIP


# ------------------------------------------------------------------------ resources

# How a message row names its part of a resource, per scope (the relay's --circuit-scope; the
# scopes and the full names are relay/core/resources.py's). Computed in the claim's WHERE clause,
# so an excluded resource's rows are passed by inside the index scan.
RESOURCE_PARTS: Mapping[str, str] = {
    "broker": "''",  # one resource per broker endpoint and vhost: coarsest
    "exchange": "exchange",  # the default
    "routing_key": "exchange || '/' || routing_key",  # finest: each exchange + routing key
}
