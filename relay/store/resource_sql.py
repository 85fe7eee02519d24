"""Every statement on the shared resource table (circuits and rate-limit buckets), both databases.

Relays change a resource row in one short transaction: make sure it exists, read it under a row
lock (PostgreSQL: FOR UPDATE; SQLite: the write lock BEGIN IMMEDIATE already holds), apply a pure
transition (relay/core/circuit.py, relay/core/bucket.py) and write every column back.
"""

from __future__ import annotations

# How a message row names its part of the resource, per scope (the relay's --circuit-scope).
# The full resource name is the broker endpoint and vhost, then this part: see relay/resources.py.
SCOPES: dict[str, str] = {
    "broker": "''",  # one resource per broker endpoint and vhost: coarsest
    "exchange": "exchange",  # the default
    "routing_key": "exchange || '/' || routing_key",  # finest: each exchange + routing key
}

LIST = """
SELECT resource, state, failures, opens, open_until, probe_owner, probe_until, last_error,
       changed_at, tokens, tokens_at
FROM outbox_resource ORDER BY resource
"""

ENSURE_PG = "INSERT INTO outbox_resource (resource) VALUES (:resource) ON CONFLICT DO NOTHING"
ENSURE_SQLITE = "INSERT OR IGNORE INTO outbox_resource (resource) VALUES (:resource)"

# PostgreSQL's now() is the clock every relay shares; it is read in the same statement as the row.
LOCK_PG = """
SELECT resource, state, failures, opens, open_until, probe_owner, probe_until, last_error,
       changed_at, tokens, tokens_at, now()
FROM outbox_resource WHERE resource = :resource FOR UPDATE
"""
LOCK_SQLITE = """
SELECT resource, state, failures, opens, open_until, probe_owner, probe_until, last_error,
       changed_at, tokens, tokens_at
FROM outbox_resource WHERE resource = :resource
"""

UPDATE = """
UPDATE outbox_resource
SET state = :state, failures = :failures, opens = :opens, open_until = :open_until,
    probe_owner = :probe_owner, probe_until = :probe_until, last_error = :last_error,
    changed_at = :changed_at, tokens = :tokens, tokens_at = :tokens_at
WHERE resource = :resource
"""

DELETE = "DELETE FROM outbox_resource WHERE resource = :resource"

# Relay heartbeats (outbox_relay): each running relay refreshes its row every few seconds.
HEARTBEAT_PG = """
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, now(), now())
ON CONFLICT (relay_id) DO UPDATE SET last_seen = now()
"""
HEARTBEAT_SQLITE = """
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, :now, :now)
ON CONFLICT (relay_id) DO UPDATE SET last_seen = :now
"""
FORGET_RELAY = "DELETE FROM outbox_relay WHERE relay_id = :relay_id"
RELAYS_PG = """
SELECT relay_id, started_at, last_seen FROM outbox_relay
WHERE last_seen > now() - make_interval(secs => :within) ORDER BY relay_id
"""
RELAYS_SQLITE = """
SELECT relay_id, started_at, last_seen FROM outbox_relay WHERE last_seen > :since ORDER BY relay_id
"""
