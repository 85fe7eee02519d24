"""Every statement the relay runs on PostgreSQL, named and commented. Values are always bound.

Each runs as a single statement in autocommit mode: one round trip, and no transaction left open
between a claim and its settlement (the lease, not a lock, protects the row in between).
"""

from __future__ import annotations

# Take up to :limit ready rows, highest priority first, then the longest due, then enqueue order
# (the order of the two ready indexes, so these are index range scans however many published rows
# the table holds). SKIP LOCKED lets concurrent relays claim disjoint rows without waiting.
#
# Per-key order: a keyed row is claimed only while no earlier row of its key is unfinished
# ({blocking}: pending or in flight, and dead when a dead head holds its key), so at most one
# message per key is in flight across all relays and a failing message holds back only its own
# key. A keyed row found to have an earlier unfinished one is *parked* (held = true): it leaves
# the ready index, so a key with thousands of messages queued behind its head costs later claims
# nothing. MARK_PUBLISHED unparks the next message of each key it settles, and UNPARK_SWEEP
# catches every other way a key can come free (dead-lettered, cancelled or discarded heads).
#
# Resources ({resource}: the row's part of its resource name, see resource_sql.SCOPES): rows of
# the resources in :exclude (open circuits, rate-limited destinations) are passed by, so they never
# take a place in a batch; :only, when not null, claims for that one resource (a probe, or the
# share a rate limit allows).
_CLAIM = """
WITH unkeyed AS (
    SELECT seq, priority, available_at FROM outbox_message
    WHERE state = 'pending' AND key IS NULL AND available_at <= now() {filter}
    ORDER BY priority DESC, available_at, seq
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), keyed AS (
    SELECT seq, priority, available_at,
           NOT EXISTS (
               SELECT 1 FROM outbox_message AS e
               WHERE e.key = m.key AND e.seq < m.seq AND e.state IN ({blocking})
           ) AS head
    FROM outbox_message AS m
    WHERE state = 'pending' AND key IS NOT NULL AND NOT held AND available_at <= now() {filter}
    ORDER BY priority DESC, available_at, seq
    LIMIT :scan
    FOR UPDATE SKIP LOCKED
), parked AS (
    UPDATE outbox_message AS p SET held = true
    FROM keyed WHERE p.seq = keyed.seq AND NOT keyed.head
    RETURNING p.seq
), ready AS (
    SELECT seq FROM (
        SELECT seq, priority, available_at FROM unkeyed
        UNION ALL
        SELECT seq, priority, available_at FROM keyed WHERE head
    ) AS both_kinds
    ORDER BY priority DESC, available_at, seq
    LIMIT :limit
)
UPDATE outbox_message AS m
SET state = 'in_flight',
    attempts = m.attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = now() + make_interval(secs => :lease_seconds)
FROM ready
WHERE m.seq = ready.seq
RETURNING m.seq, m.id, m.exchange, m.routing_key, m.payload, m.content_type, m.headers, m.key,
          m.priority, m.attempts, m.max_attempts, m.available_at, m.created_at, m.traceparent,
          m.tracestate
"""
_RESOURCE_FILTER = """
      AND NOT ({resource} = ANY(CAST(:exclude AS text[])))
      AND (CAST(:only AS text) IS NULL OR {resource} = CAST(:only AS text))"""


# Whether a resource has a message a probe could take (checked before taking the probe, so an
# idle resource is not probed with nothing and its circuit stays open until a message comes).
_HAS_READY = """
SELECT EXISTS (
    SELECT 1 FROM outbox_message
    WHERE state = 'pending' AND available_at <= now() AND NOT held AND {resource} = :only
)
"""


def has_ready(*, resource: str) -> str:
    return _HAS_READY.format(resource=resource)


def claim(*, hold: bool, resource: str) -> str:
    """The claim statement for a dead-key mode and a resource expression (never user input)."""
    blocking = "'pending', 'in_flight', 'dead'" if hold else "'pending', 'in_flight'"
    return _CLAIM.format(blocking=blocking, filter=_RESOURCE_FILTER.format(resource=resource))


# Only rows still in flight under this token change: a relay whose lease expired (and whose rows
# another relay took over) can never overwrite the newer owner's work. The next parked message of
# each key just published (its lowest seq) is unparked in the same statement.
MARK_PUBLISHED = """
WITH done AS (
    UPDATE outbox_message
    SET state = 'published', published_at = now(), last_error = NULL,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE seq = ANY(CAST(:seqs AS bigint[])) AND lease_token = :token AND state = 'in_flight'
    RETURNING key
), unparked AS (
    UPDATE outbox_message SET held = false
    WHERE seq IN (
        SELECT (SELECT min(h.seq) FROM outbox_message AS h
                WHERE h.key = k.key AND h.state = 'pending' AND h.held)
        FROM (SELECT DISTINCT key FROM done WHERE key IS NOT NULL) AS k
    )
    RETURNING 1
)
SELECT count(*) FROM done
"""

# The first parked message of every key is unparked when nothing earlier blocks it: heads that
# were dead-lettered (with {blocking} lacking 'dead'), cancelled or discarded. One probe per key
# with parked messages; run every few seconds as a safety net, not per claim.
_UNPARK_SWEEP = """
WITH firsts AS (
    SELECT key, min(seq) AS seq FROM outbox_message
    WHERE state = 'pending' AND held AND key IS NOT NULL
    GROUP BY key
)
UPDATE outbox_message SET held = false
WHERE seq IN (
    SELECT f.seq FROM firsts AS f
    WHERE NOT EXISTS (
        SELECT 1 FROM outbox_message AS e
        WHERE e.key = f.key AND e.seq < f.seq AND e.state IN ({blocking})
    )
)
"""
UNPARK_SWEEP_HOLD = _UNPARK_SWEEP.format(blocking="'pending', 'in_flight', 'dead'")
UNPARK_SWEEP_SKIP = _UNPARK_SWEEP.format(blocking="'pending', 'in_flight'")

RELEASE = """
UPDATE outbox_message
SET state = 'pending', available_at = now() + make_interval(secs => :delay_seconds),
    last_error = :error, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq = ANY(CAST(:seqs AS bigint[])) AND lease_token = :token AND state = 'in_flight'
"""

EXTEND_LEASES = """
UPDATE outbox_message
SET lease_expires_at = now() + make_interval(secs => :lease_seconds)
WHERE lease_token = ANY(CAST(:tokens AS uuid[])) AND state = 'in_flight'
"""

# Failed attempts, settled in one statement: each row goes back to pending (with its next
# attempt time) or to dead, guarded by the lease token like MARK_PUBLISHED, and an attempt record
# is written for exactly the rows that changed. `unburn` is 1 for failures that must not count
# against max_attempts (the claim counted the attempt already).
SETTLE_FAILURES = """
WITH d AS (
    SELECT * FROM unnest(
        CAST(:seqs AS bigint[]), CAST(:states AS text[]), CAST(:available_at AS timestamptz[]),
        CAST(:unburn AS int[]), CAST(:classes AS text[]), CAST(:outcomes AS text[]),
        CAST(:errors AS text[])
    ) AS d(seq, state, available_at, unburn, failure_class, outcome, error)
), settled AS (
    UPDATE outbox_message AS m
    SET state = d.state,
        available_at = coalesce(d.available_at, m.available_at),
        attempts = m.attempts - d.unburn,
        last_error = d.error,
        last_failed_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM d
    WHERE m.seq = d.seq AND m.lease_token = :token AND m.state = 'in_flight'
    RETURNING m.id, m.attempts + d.unburn AS attempt, d.failure_class, d.outcome, d.error,
              d.available_at
)
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
SELECT id, attempt, now(), :relay_id, failure_class, outcome, error, available_at FROM settled
"""

# A lease that expired means its relay died or stalled after claiming: the broker may or may not
# have the message, so it is republished (same message id) and the attempt is recorded as
# ambiguous. available_at is left alone: it is in the past, so the row keeps its place in line.
# A row that has used up its attempts this way (a message that kills every relay that claims
# it) goes to dead instead of coming round again. :max_attempts is the relay's default; a
# per-exchange override is not consulted here.
RECLAIM_EXPIRED = """
WITH expired AS (
    SELECT seq, lease_owner FROM outbox_message
    WHERE state = 'in_flight' AND lease_expires_at < now()
    FOR UPDATE SKIP LOCKED
), reclaimed AS (
    UPDATE outbox_message AS m
    SET state = CASE WHEN m.attempts >= coalesce(m.max_attempts, :max_attempts)
                     THEN 'dead' ELSE 'pending' END,
        last_error = 'lease held by ' || coalesce(expired.lease_owner, '?')
                     || ' expired before it settled',
        last_failed_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM expired
    WHERE m.seq = expired.seq
    RETURNING m.id, m.attempts, m.last_error, m.state
)
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
SELECT id, attempts, now(), :relay_id, 'ambiguous',
       CASE WHEN state = 'dead' THEN 'dead' ELSE 'retry' END, last_error,
       CASE WHEN state = 'dead' THEN NULL ELSE now() END
FROM reclaimed
"""

COUNT_BY_STATE = "SELECT state, count(*) FROM outbox_message GROUP BY state"

PENDING_SUMMARY = """
SELECT count(*) FILTER (WHERE available_at <= now()),
       count(*) FILTER (WHERE available_at > now()),
       EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE available_at <= now()))
FROM outbox_message
WHERE state = 'pending'
"""

PING = "SELECT 1"
