"""Statements and fragments that are the same text on PostgreSQL and on SQLite, written once.

A dialect takes what it can use from here and writes the rest itself (postgres.py, sqlite.py); a
database whose SQL differs (MySQL cannot UPDATE a table it selects from in a subquery) writes its
own. Nothing here is a value: every value is bound.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping

from relay.core import suspects

# ------------------------------------------------------------------------ per-key order

# The states of an earlier message of the same key that keep a keyed message waiting: unfinished
# ones always; dead ones too with dead_key="hold" (a dead head holds its key until an operator
# replays or discards it), not with "skip". A literal list, never a bound array: it must match the
# partial index outbox_message_key_idx (outbox/schema.py) for the planner to probe it.
BLOCKING_HOLD = "'pending', 'in_flight', 'dead'"
BLOCKING_SKIP = "'pending', 'in_flight'"


def blocking_states(*, hold: bool) -> str:
    return BLOCKING_HOLD if hold else BLOCKING_SKIP


def is_head(row: str, *, blocking: str, unless: str = "") -> str:
    """True when no earlier message of `row`'s key is in a blocking state: one probe of
    outbox_message_key_idx. `row` is the alias of the message looked at; `unless`, a condition
    on `e` that lets an earlier message not count (one being published by the same statement)."""
    also = f" AND NOT ({unless})" if unless else ""
    return f"""NOT EXISTS (
        SELECT 1 FROM outbox_message AS e
        WHERE e.key = {row}.key AND e.seq < {row}.seq AND e.state IN ({blocking}){also}
    )"""  # noqa: S608 - an alias and a literal list of this module's


# The first parked message of every key is unparked when nothing earlier blocks it any more:
# heads that were dead-lettered (with dead_key="skip"), cancelled or discarded. Settling a message
# unparks the next of its key at once (each dialect's mark statement); this sweep catches every
# other way a key comes free. One probe per key with parked messages: the relay runs it every few
# seconds as a safety net, an operator command after cancelling or discarding.
_UNPARK_SWEEP = """
UPDATE outbox_message SET held = false
WHERE seq IN (
    SELECT f.seq FROM (
        SELECT key, min(seq) AS seq FROM outbox_message
        WHERE state = 'pending' AND held AND key IS NOT NULL
        GROUP BY key
    ) AS f
    WHERE {head}
)
"""


def unpark_sweep(*, blocking: str, head: Callable[..., str] = is_head) -> str:
    """The sweep, with a dialect's own form of `is_head` when it has one."""
    return _UNPARK_SWEEP.format(head=head("f", blocking=blocking))


# ------------------------------------------------------------------------ crash isolation

# The suspects' stamps (relay/core/suspects.py holds the rules), bound into the statements that
# claim, give back and take back rows.
GROUPED = suspects.GROUPED
SOLITARY = suspects.SOLITARY
ALONE = suspects.ALONE


def reason_sql(template: str, **fields: str) -> str:
    """One of relay/core/suspects.py's reason templates as a SQL text expression (||): its
    literal parts quoted, each field the SQL expression given for it. So a statement that takes
    leases back in SQL (postgres._RECLAIM) writes the core's text."""
    parts: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        if literal:
            parts.append("'" + literal.replace("'", "''") + "'")
        if name is not None:
            parts.append(fields[name])
    return " || ".join(parts)


# ------------------------------------------------------------------------ resources

# How a message row names its part of a resource, per scope (the relay's --circuit-scope; the
# scopes and the full names are relay/core/resources.py's). Computed in the claim's WHERE clause,
# so an excluded resource's rows are passed by inside the index scan.
RESOURCE_PARTS: Mapping[str, str] = {
    "broker": "''",  # one resource per broker endpoint and vhost: coarsest
    "exchange": "exchange",  # the default
    "routing_key": "exchange || '/' || routing_key",  # finest: each exchange + routing key
}

# The shared rows of circuits and rate-limit buckets (outbox_resource). A relay changes one in a
# short transaction: ENSURE_RESOURCE, then the dialect's lock_resource (which reads it under a
# lock, with the database's time), a pure transition (relay/core/circuit.py, bucket.py), then
# UPDATE_RESOURCE with every column.
ENSURE_RESOURCE = "INSERT INTO outbox_resource (resource) VALUES (:resource) ON CONFLICT DO NOTHING"

RESOURCE_COLUMNS = """resource, state, failures, opens, open_until, probe_owner, probe_until,
       last_error, changed_at, tokens, tokens_at"""

LIST_RESOURCES = f"SELECT {RESOURCE_COLUMNS} FROM outbox_resource ORDER BY resource"  # noqa: S608

UPDATE_RESOURCE = """
UPDATE outbox_resource
SET state = :state, failures = :failures, opens = :opens, open_until = :open_until,
    probe_owner = :probe_owner, probe_until = :probe_until, last_error = :last_error,
    changed_at = :changed_at, tokens = :tokens, tokens_at = :tokens_at
WHERE resource = :resource
"""

# ------------------------------------------------------------------------ relays, probes

# A relay's heartbeat row goes when it stops cleanly (a crashed one ages out of `relays`).
FORGET_RELAY = "DELETE FROM outbox_relay WHERE relay_id = :relay_id"

# LIVENESS. A running relay registers (its row's started_at names this run of it) and then beats
# every heartbeat interval, from a thread of its own: BEAT touches its row only while started_at
# still names this run. Another relay that finds a row older than :dead_after deletes it and takes
# back that relay's leases in the same statement (each dialect's RECLAIM_DEAD), as an expired lease
# would be taken, without waiting for the lease. The lease token still guards every write, so a
# relay that was only slow changes nothing that was taken from it; its next beat finds its row gone
# and it gives back what it still holds (relay/loop/pulse.py).
BEAT = """
UPDATE outbox_relay SET last_seen = {now}
WHERE relay_id = :relay_id AND started_at = :started_at
"""

PING = "SELECT 1"

# ------------------------------------------------------------------------ counting by state

# Status, the state gauges and the console count through the partial indexes, which hold the
# backlog and the failures but never a published row, so they cost the same beside any number of
# published rows (relay/store/counting.py). Each WHERE clause names an index's predicate as
# written in outbox/schema.py, restated beside a narrower condition where it must be: PostgreSQL
# and SQLite use a partial index only when the query's WHERE clause visibly implies its predicate.
# `m.key`: unqualified, `key` is a reserved word on MySQL.

# The pending rows, between them: unkeyed ones (outbox_message_ready_idx), keyed ones not parked
# (outbox_message_ready_keyed_idx), and the parked ones, through the per-key index.
PENDING_PARTS: tuple[str, ...] = (
    "m.state = 'pending' AND m.key IS NULL",
    "m.state = 'pending' AND m.key IS NOT NULL AND NOT m.held",
    f"m.key IS NOT NULL AND m.state IN ({BLOCKING_HOLD}) AND m.state = 'pending' AND m.held",
)

# In flight (outbox_message_lease_idx), dead and discarded (outbox_message_failed_idx): the
# other states counted exactly. Only states with rows come back.
COUNT_OPEN = """
SELECT state, count(*) FROM outbox_message WHERE state = 'in_flight' GROUP BY state
UNION ALL
SELECT state, count(*) FROM outbox_message WHERE state IN ('dead', 'discarded') GROUP BY state
"""

# Published and cancelled, exactly: no index holds them, so this reads the whole table. Only run
# when the table is small (relay/store/estimates.py); beside a large one they are estimated.
COUNT_SETTLED = """
SELECT state, count(*) FROM outbox_message WHERE state IN ('published', 'cancelled') GROUP BY state
"""

# The same per exchange (status and the console's table): (exchange, state, count, the earliest
# due time among its pending rows due by :now). Through the same indexes: each row they hold
# costs a heap read for its exchange, none of the published rows does.
_EXCHANGE_PENDING = """
SELECT m.exchange, 'pending' AS state, count(*) AS n,
       min(CASE WHEN m.available_at <= :now THEN m.available_at END) AS oldest
FROM outbox_message AS m WHERE {where} GROUP BY m.exchange
"""
EXCHANGE_OPEN = "UNION ALL".join(
    [
        *(_EXCHANGE_PENDING.format(where=where) for where in PENDING_PARTS),
        """
SELECT exchange, state, count(*), NULL FROM outbox_message WHERE state = 'in_flight'
GROUP BY exchange, state
""",
        """
SELECT exchange, state, count(*), NULL FROM outbox_message WHERE state IN ('dead', 'discarded')
GROUP BY exchange, state
""",
    ]
)

EXCHANGE_SETTLED = """
SELECT exchange, state, count(*) FROM outbox_message WHERE state IN ('published', 'cancelled')
GROUP BY exchange, state
"""

# ------------------------------------------------------------------------ the console's charts

# Messages published per minute since :since. published_at has no index; the id range bounds the
# scan instead: ids are UUIDv7, time-ordered, and :id_floor is the first id of a moment, so only
# the messages enqueued since then are read, however many the table holds. {minute} truncates a
# time to its minute, as each database can.
PUBLISHED_PER_MINUTE = """
SELECT {minute} AS minute, count(*) AS n
FROM outbox_message
WHERE id >= :id_floor AND state = 'published' AND published_at >= :since
GROUP BY {minute}
"""

# The relays' failed attempts per minute and outcome (retry, deferred, dead), through the index
# on outbox_attempt.at; operators' records (failure_class 'operator') are not failures.
FAILED_PER_MINUTE = """
SELECT {minute} AS minute, outcome, count(*) AS n
FROM outbox_attempt
WHERE at >= :since AND failure_class <> 'operator'
GROUP BY {minute}, outcome
"""

# ------------------------------------------------------------------------ retention

# The rows a purge may delete. The id range comes first: it is the index range scanned (see
# relay/store/retention.py); :after_id is the id of the last row the previous batch of the same
# purge deleted, so a purge never re-walks rows it has already passed. Each branch names its
# terminal states, so a `pending` or `in_flight` row can never match, whatever :states holds.
# {state_in} tests :states (bound as the dialect binds a list); {failed_at} is the latest time
# anything happened to a failed row.
ELIGIBLE = """
id > :after_id AND id < :cutoff_id
AND {state_in}
AND (
    (state = 'published' AND published_at < :cutoff)
    OR (state IN ('dead', 'discarded', 'cancelled') AND {failed_at} < :cutoff)
)
"""
