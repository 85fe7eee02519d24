"""Every statement the relay runs on SQLite, named and commented. Values are always bound.

SQLite has one writer at a time, so a claim is a single UPDATE ... RETURNING: the write lock it
takes is what keeps two relays from claiming the same row. Times are bound from Python (:now),
in the same text format SQLAlchemy's DateTime type writes, so comparisons are plain string order.
"""

from __future__ import annotations

# Claiming is four statements in one BEGIN IMMEDIATE transaction (the write lock is held
# throughout): the unkeyed and keyed candidates, parking keyed rows that are not the head of their
# key, and leasing the chosen rows. Per-key order and parking work as in postgres_sql.CLAIM_*.
_SELECT_UNKEYED = """
SELECT seq, priority, available_at FROM outbox_message
WHERE state = 'pending' AND key IS NULL AND available_at <= :now {filter}
ORDER BY priority DESC, available_at, seq
LIMIT :limit
"""

_SELECT_KEYED = """
SELECT seq, priority, available_at,
       NOT EXISTS (
           SELECT 1 FROM outbox_message AS e
           WHERE e.key = m.key AND e.seq < m.seq AND e.state IN ({blocking})
       ) AS head
FROM outbox_message AS m
WHERE state = 'pending' AND key IS NOT NULL AND NOT held AND available_at <= :now {filter}
ORDER BY priority DESC, available_at, seq
LIMIT :scan
"""

# Resources: see postgres_sql._CLAIM. :exclude is a JSON array.
_RESOURCE_FILTER = """
  AND {resource} NOT IN (SELECT value FROM json_each(:exclude))
  AND (:only IS NULL OR {resource} = :only)"""


# See postgres_sql._HAS_READY.
_HAS_READY = """
SELECT EXISTS (
    SELECT 1 FROM outbox_message
    WHERE state = 'pending' AND available_at <= :now AND NOT held AND {resource} = :only
)
"""


def has_ready(*, resource: str) -> str:
    return _HAS_READY.format(resource=resource)


def select_unkeyed(*, resource: str) -> str:
    return _SELECT_UNKEYED.format(filter=_RESOURCE_FILTER.format(resource=resource))


def select_keyed(*, hold: bool, resource: str) -> str:
    blocking = "'pending', 'in_flight', 'dead'" if hold else "'pending', 'in_flight'"
    return _SELECT_KEYED.format(
        blocking=blocking, filter=_RESOURCE_FILTER.format(resource=resource)
    )


PARK = """
UPDATE outbox_message SET held = 1 WHERE seq IN (SELECT value FROM json_each(:seqs))
"""

CLAIM = """
UPDATE outbox_message
SET state = 'in_flight',
    attempts = attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = :expires
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND state = 'pending'
RETURNING seq, id, exchange, routing_key, payload, content_type, headers, key,
          priority, attempts, max_attempts, available_at, created_at, traceparent,
          tracestate
"""

# The next parked message of each key in :keys (a JSON array); see postgres_sql._UNPARK_NEXT.
UNPARK_NEXT = """
UPDATE outbox_message SET held = 0
WHERE seq IN (
    SELECT (SELECT min(h.seq) FROM outbox_message AS h
            WHERE h.key = k.value AND h.state = 'pending' AND h.held)
    FROM json_each(:keys) AS k
)
"""

# See postgres_sql._UNPARK_SWEEP.
_UNPARK_SWEEP = """
UPDATE outbox_message SET held = 0
WHERE seq IN (
    SELECT f.seq FROM (
        SELECT key, min(seq) AS seq FROM outbox_message
        WHERE state = 'pending' AND held AND key IS NOT NULL
        GROUP BY key
    ) AS f
    WHERE NOT EXISTS (
        SELECT 1 FROM outbox_message AS e
        WHERE e.key = f.key AND e.seq < f.seq AND e.state IN ({blocking})
    )
)
"""
UNPARK_SWEEP_HOLD = _UNPARK_SWEEP.format(blocking="'pending', 'in_flight', 'dead'")
UNPARK_SWEEP_SKIP = _UNPARK_SWEEP.format(blocking="'pending', 'in_flight'")

# Guarded by the lease token: see postgres_sql.MARK_PUBLISHED. :seqs is a JSON array. Followed,
# in the same transaction, by UNPARK_NEXT for the keys it returns.
MARK_PUBLISHED = """
UPDATE outbox_message
SET state = 'published', published_at = :now, last_error = NULL,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND lease_token = :token
  AND state = 'in_flight'
RETURNING key
"""

RELEASE = """
UPDATE outbox_message
SET state = 'pending', available_at = :available_at,
    last_error = :error, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND lease_token = :token
  AND state = 'in_flight'
"""

# :tokens is a JSON array of UUIDs in the 32-hex-digit form SQLAlchemy's Uuid type stores.
EXTEND_LEASES = """
UPDATE outbox_message
SET lease_expires_at = :expires
WHERE lease_token IN (SELECT value FROM json_each(:tokens)) AND state = 'in_flight'
"""

# Failed attempts: see postgres_sql.SETTLE_FAILURES. SQLite runs these per row inside one
# BEGIN IMMEDIATE transaction (the write lock is held throughout, so the pair is atomic).
SETTLE_ONE = """
UPDATE outbox_message
SET state = :state,
    available_at = coalesce(:available_at, available_at),
    attempts = attempts - :unburn,
    last_error = :error,
    last_failed_at = :now,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq = :seq AND lease_token = :token AND state = 'in_flight'
RETURNING id, attempts + :unburn
"""

INSERT_ATTEMPT = """
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
VALUES (:message_id, :attempt, :now, :relay_id, :failure_class, :outcome, :error, :next_at)
"""

# Expired leases: see postgres_sql.RECLAIM_EXPIRED.
RECLAIM_EXPIRED = """
UPDATE outbox_message
SET state = CASE WHEN attempts >= coalesce(max_attempts, :max_attempts)
                 THEN 'dead' ELSE 'pending' END,
    last_error = 'lease held by ' || coalesce(lease_owner, '?') || ' expired before it settled',
    last_failed_at = :now,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE state = 'in_flight' AND lease_expires_at < :now
RETURNING id, attempts, last_error, state
"""

COUNT_BY_STATE = "SELECT state, count(*) FROM outbox_message GROUP BY state"

PENDING_SUMMARY = """
SELECT coalesce(sum(available_at <= :now), 0),
       coalesce(sum(available_at > :now), 0),
       min(CASE WHEN available_at <= :now THEN available_at END)
FROM outbox_message
WHERE state = 'pending'
"""

PING = "SELECT 1"
