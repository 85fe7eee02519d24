-- The statements and fragments every dialect shares, written once. Read by relay/store/queries.py
-- (the format and the {{name}} placeholder are described there). A statement here names a block
-- each dialect's file defines where the databases write it apart: {{now}} (the time to use),
-- {{leased}} (the lease guard), {{delayed}} (a time :delay_seconds from now),
-- {{published_minute}} and {{failed_minute}} (a time's minute), {{eligible_states}} and
-- {{failed_at}} (retention). Nothing here is a value: every value is bound.

-- ------------------------------------------------------------------------ per-key order

-- blocking_hold --
-- The states of an earlier message of the same key that keep a keyed message waiting: unfinished
-- ones always; dead ones too with dead_key="hold" (a dead head holds its key until an operator
-- replays or discards it), not with "skip" (blocking_skip). A literal list, never a bound array:
-- it must match the partial index outbox_message_key_idx (outbox/schema.py) for the planner to
-- probe it. Dialect.__init__ fills {{blocking}} with one of the two.
'pending', 'in_flight', 'dead'

-- blocking_skip --
'pending', 'in_flight'

-- ------------------------------------------------------------------------ giving rows back

-- release --
-- Rows a relay gives back unsent (it is stopping before the broker confirmed them): pending again,
-- due after :delay_seconds, so another relay may take them. The claim counted an attempt that never
-- happened, so it is given back (never below zero). A suspect stays one (its lease_expires_at set)
-- and one claimed alone stays solitary: relay/core/suspects.py's release, which
-- tests/integration/test_suspects_match_core.py holds this to. {{leased}} is each dialect's lease
-- guard, as in mark_published.
UPDATE outbox_message
SET state = 'pending',
    available_at = {{delayed}},
    attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    lease_expires_at = CASE WHEN last_error IN (:alone, :grouped) THEN {{now}} END,
    last_error = CASE WHEN last_error = :alone THEN :solitary ELSE :error END,
    lease_owner = NULL, lease_token = NULL
WHERE {{leased}}

-- ------------------------------------------------------------------------ resources

-- resource_columns --
-- The shared rows of circuits and rate-limit buckets (outbox_resource). A relay changes one in a
-- short transaction: the dialect's ensure_resource, then its lock_resource (which reads it under a
-- lock, with the database's time), a pure transition (relay/core/circuit.py, bucket.py), then
-- update_resource with every column.
resource, state, failures, opens, open_until, probe_owner, probe_until,
       last_error, changed_at, tokens, tokens_at

-- list_resources --
SELECT {{resource_columns}} FROM outbox_resource ORDER BY resource

-- update_resource --
UPDATE outbox_resource
SET state = :state, failures = :failures, opens = :opens, open_until = :open_until,
    probe_owner = :probe_owner, probe_until = :probe_until, last_error = :last_error,
    changed_at = :changed_at, tokens = :tokens, tokens_at = :tokens_at
WHERE resource = :resource

-- ------------------------------------------------------------------------ relays, probes

-- forget_relay --
-- A relay's heartbeat row goes when it stops cleanly (a crashed one ages out of `relays`).
DELETE FROM outbox_relay WHERE relay_id = :relay_id

-- beat --
-- LIVENESS. A running relay registers (its row's started_at names this run of it) and then beats
-- every heartbeat interval, from a thread of its own: beat touches its row only while started_at
-- still names this run. Another relay that finds a row older than :dead_after deletes it and takes
-- back that relay's leases in the same statement (each dialect's reclaim_dead), as an expired lease
-- would be taken, without waiting for the lease. The lease token still guards every write, so a
-- relay that was only slow changes nothing that was taken from it; its next beat finds its row gone
-- and it gives back what it still holds (relay/loop/pulse.py).
UPDATE outbox_relay SET last_seen = {{now}}
WHERE relay_id = :relay_id AND started_at = :started_at

-- ping --
SELECT 1

-- ------------------------------------------------------------------------ counting by state

-- Status, the state gauges and the console count through the partial indexes, which hold the
-- backlog and the failures but never a published row, so they cost the same beside any number of
-- published rows (relay/store/counting.py). Each WHERE clause names an index's predicate as
-- written in outbox/schema.py, restated beside a narrower condition where it must be: PostgreSQL
-- and SQLite use a partial index only when the query's WHERE clause visibly implies its predicate.
-- `m.key`: unqualified, `key` is a reserved word on MySQL.

-- pending_unkeyed --
-- The pending rows, between the three: unkeyed ones (outbox_message_ready_idx), keyed ones not
-- parked (outbox_message_ready_keyed_idx), and the parked ones, through the per-key index.
m.state = 'pending' AND m.key IS NULL

-- pending_keyed --
m.state = 'pending' AND m.key IS NOT NULL AND NOT m.held

-- pending_parked --
m.key IS NOT NULL AND m.state IN ({{blocking_hold}}) AND m.state = 'pending' AND m.held

-- count_open --
-- In flight (outbox_message_lease_idx), dead and discarded (outbox_message_failed_idx): the
-- other states counted exactly. Only states with rows come back.
SELECT state, count(*) FROM outbox_message WHERE state = 'in_flight' GROUP BY state
UNION ALL
SELECT state, count(*) FROM outbox_message WHERE state IN ('dead', 'discarded') GROUP BY state

-- count_settled --
-- Published and cancelled, exactly: no index holds them, so this reads the whole table. Only run
-- when the table is small (relay/store/estimates.py); beside a large one they are estimated.
SELECT state, count(*) FROM outbox_message WHERE state IN ('published', 'cancelled') GROUP BY state

-- exchange_open --
-- The same per exchange (status and the console's table): (exchange, state, count, the earliest
-- due time among its pending rows due by :now). Through the same indexes: each row they hold
-- costs a heap read for its exchange, none of the published rows does.
SELECT m.exchange, 'pending' AS state, count(*) AS n,
       min(CASE WHEN m.available_at <= :now THEN m.available_at END) AS oldest
FROM outbox_message AS m WHERE {{pending_unkeyed}} GROUP BY m.exchange
UNION ALL
SELECT m.exchange, 'pending' AS state, count(*) AS n,
       min(CASE WHEN m.available_at <= :now THEN m.available_at END) AS oldest
FROM outbox_message AS m WHERE {{pending_keyed}} GROUP BY m.exchange
UNION ALL
SELECT m.exchange, 'pending' AS state, count(*) AS n,
       min(CASE WHEN m.available_at <= :now THEN m.available_at END) AS oldest
FROM outbox_message AS m WHERE {{pending_parked}} GROUP BY m.exchange
UNION ALL
SELECT exchange, state, count(*), NULL FROM outbox_message WHERE state = 'in_flight'
GROUP BY exchange, state
UNION ALL
SELECT exchange, state, count(*), NULL FROM outbox_message WHERE state IN ('dead', 'discarded')
GROUP BY exchange, state

-- exchange_settled --
SELECT exchange, state, count(*) FROM outbox_message WHERE state IN ('published', 'cancelled')
GROUP BY exchange, state

-- ------------------------------------------------------------------------ the console's charts

-- published_per_minute --
-- Messages published per minute since :since. published_at has no index; the id range bounds the
-- scan instead: ids are UUIDv7, time-ordered, and :id_floor is the first id of a moment, so only
-- the messages enqueued since then are read, however many the table holds. {{published_minute}}
-- truncates a time to its minute, as each database can.
SELECT {{published_minute}} AS minute, count(*) AS n
FROM outbox_message
WHERE id >= :id_floor AND state = 'published' AND published_at >= :since
GROUP BY {{published_minute}}

-- failed_per_minute --
-- The relays' failed attempts per minute and outcome (retry, deferred, dead), through the index
-- on outbox_attempt.at; operators' records (failure_class 'operator') are not failures.
SELECT {{failed_minute}} AS minute, outcome, count(*) AS n
FROM outbox_attempt
WHERE at >= :since AND failure_class <> 'operator'
GROUP BY {{failed_minute}}, outcome

-- ------------------------------------------------------------------------ retention

-- eligible --
-- The rows a purge may delete. The id range comes first: it is the index range scanned (see
-- relay/store/retention.py); :after_id is the id of the last row the previous batch of the same
-- purge deleted, so a purge never re-walks rows it has already passed. Each branch names its
-- terminal states, so a `pending` or `in_flight` row can never match, whatever :states holds.
-- {{eligible_states}} tests :states (bound as the dialect binds a list); {{failed_at}} is the
-- latest time anything happened to a failed row.
id > :after_id AND id < :cutoff_id
AND {{eligible_states}}
AND (
    (state = 'published' AND published_at < :cutoff)
    OR (state IN ('dead', 'discarded', 'cancelled') AND {{failed_at}} < :cutoff)
)

-- count_eligible --
-- For --dry-run and the progress bar: the rows a purge started now would delete (less any that
-- are locked when it runs).
SELECT count(*) FROM outbox_message WHERE {{eligible}}
