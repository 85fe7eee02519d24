-- The statements and fragments the dialects share, written once. Read by relay/store/queries.py
-- (the format and the {{name}} placeholder are described there). A statement here names a block
-- each dialect's file defines where the databases write it apart: {{now}} (the time to use),
-- {{in_seqs}} (the rows of the list :seqs), {{delayed}} (a time :delay_seconds from now),
-- {{lease_ends}} (:lease_seconds from now), {{lock_rows}} and {{skip_locked}} (the row locks a
-- read takes: FOR UPDATE, without waiting for a locked row or not), {{transitions}} and
-- {{attempt_rows}} (the rows of a JSON array, relay/store/transitions.py), {{published_minute}}
-- and {{failed_minute}} (a time's minute), {{eligible_states}} and {{failed_at}} (retention).
-- Nothing here is a value: every value is bound.
--
-- PostgreSQL runs a claim, a mark and a settlement as one statement of its own each; MySQL and
-- SQLite run them as a few statements in one transaction (relay/store/stepwise.py): those
-- statements are here where the two write them alike.

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

-- read_now --
-- The time a transaction of several statements uses throughout (bound as :now, never NULL then).
SELECT {{now}} AS now

-- leased --
-- The lease guard: the rows of :seqs still in flight under :token. Only rows still in flight under
-- this token change, so a relay whose lease expired (and whose rows another relay took over) can
-- never overwrite the newer owner's work, and a duplicate confirm changes nothing.
{{in_seqs}} AND lease_token = :token AND state = 'in_flight'

-- ------------------------------------------------------------------------ giving rows back

-- release --
-- Rows a relay releases unsent (it is stopping before the broker confirmed them): pending again,
-- due after :delay_seconds, so another relay may take them. The claim counted an attempt that never
-- happened, so it is refunded (never below zero). A suspect stays one, claimed as before (its
-- suspect column is not touched); for relays of schema 6 its lease_expires_at stays set and one
-- claimed alone gets :solitary in last_error (outbox.states, STAMP_SOLITARY).
UPDATE outbox_message
SET state = 'pending',
    available_at = {{delayed}},
    attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    lease_expires_at = CASE WHEN suspect IS NOT NULL THEN {{now}} END,
    last_error = CASE WHEN suspect = 'alone' THEN :solitary ELSE :error END,
    lease_owner = NULL, lease_token = NULL
WHERE {{leased}}

-- ------------------------------------------------------------------------ claiming in steps

-- park --
-- MySQL and SQLite: the keyed candidates that are neither heads nor in a run leave the ready
-- index (see postgres.sql's claim).
UPDATE outbox_message SET held = true WHERE {{in_seqs}}

-- claim_rows --
-- MySQL and SQLite: lease the rows chosen (locked since they were read, or under SQLite's write
-- lock) and their runs (a run's rows are usually parked: held is cleared). When the rows chosen
-- are suspects, claimed alone or with other suspects only, their suspect column stays as it is
-- and :stamp (outbox.states' STAMP_ALONE or STAMP_GROUPED; NULL for other rows) goes in
-- last_error for relays of schema 6.
UPDATE outbox_message
SET state = 'in_flight',
    held = false,
    attempts = attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = {{lease_ends}},
    last_error = coalesce(:stamp, last_error)
WHERE {{in_seqs}} AND state = 'pending'

-- claimed --
-- What claim_rows leased, with whether each is a suspect. `m.key`: unqualified, `key` is a
-- reserved word on MySQL.
SELECT seq, id, exchange, routing_key, payload, content_type, headers, m.key,
       priority, attempts, max_attempts, available_at, created_at, traceparent,
       tracestate, suspect IS NOT NULL AS suspect
FROM outbox_message AS m WHERE {{in_seqs}}

-- run_key --
-- The next run of a chain (see postgres.sql's claim_run): the key of row :after, whose earlier
-- rows the dialect's run_other then checks.
SELECT m.key FROM outbox_message AS m WHERE m.seq = :after

-- first_parked --
-- The unpark sweep's candidates: the first parked message of every key that has one.
SELECT p.key, min(p.seq) AS seq FROM outbox_message AS p
WHERE p.state = 'pending' AND p.held AND p.key IS NOT NULL
GROUP BY p.key

-- ------------------------------------------------------------------------ settling in steps

-- mark_rows --
-- Published, lease-guarded. PostgreSQL's mark_published runs it as its first part; MySQL and
-- SQLite read the keys first (keys_of) and unpark after (unpark_next), in one transaction.
-- Settling a row ends its suspicion.
UPDATE outbox_message
SET state = 'published', published_at = {{now}}, last_error = NULL, suspect = NULL,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE {{leased}}

-- keys_of --
-- MySQL and SQLite: the keyed rows about to be marked, with their keys (read before mark_rows
-- clears their lease), locked where the database locks rows: mark_rows then publishes these.
SELECT seq, m.key FROM outbox_message AS m
WHERE {{leased}} AND m.key IS NOT NULL
{{lock_rows}}

-- held --
-- MySQL and SQLite: failed attempts (see postgres.sql's settle_failures): the rows this lease
-- still holds, locked where the database locks rows, then transition_rows and record_attempts
-- for them all.
SELECT seq, id, attempts FROM outbox_message
WHERE {{leased}}
{{lock_rows}}

-- update_rows --
-- Rows' new values decided in Python (relay/store/transitions.py), written back in one
-- statement: a lease taken back (relay/core/suspects.py decides; the SQL holds no policy), or a
-- settlement. Only a row still in flight under the lease it was read with changes. PostgreSQL's
-- and SQLite's transition_rows; MySQL, which updates with a JOIN, writes its own.
UPDATE outbox_message AS m
SET state = d.state, attempts = d.attempts, available_at = coalesce(d.available_at, m.available_at),
    suspect = d.suspect, last_error = d.last_error, last_failed_at = {{now}},
    lease_owner = NULL, lease_token = NULL,
    lease_expires_at = CASE WHEN d.keep_expiry = 1 THEN m.lease_expires_at END
FROM {{transitions}}
WHERE m.seq = d.seq AND m.lease_token = d.token AND m.state = 'in_flight'

-- record_attempts --
-- One outbox_attempt row for each of :records (a JSON array, relay/store/transitions.py), at the
-- statement's time, by :relay_id.
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
SELECT r.message_id, r.attempt, {{now}}, :relay_id, r.failure_class, r.outcome, r.error, r.next_at
FROM {{attempt_rows}}

-- ------------------------------------------------------------------------ taking leases back

-- suspect_columns --
-- A claim candidate's suspect column read as two flags: a suspect (outbox.states.Suspect), and one
-- to be claimed alone (relay/core/suspects.py chooses).
suspect IS NOT NULL AS suspect, coalesce(suspect = 'alone', false) AS solitary

-- stuck_columns --
-- Taking leases back, as River's rescuer does (relay/store/rescuer.py): the rows are read and
-- locked in one transaction (SKIP LOCKED where the database has row locks: two relays reclaiming at
-- once take disjoint rows), relay/core/suspects.py decides what becomes of each, and
-- transition_rows and record_attempts write the decisions. A lease that expired means its relay
-- died or stalled after claiming: the broker may or may not have the message, so it is
-- republished (same message id), and the attempt is recorded as ambiguous. :now is the
-- transaction's time (read_now).
seq, id, lease_owner, lease_token, suspect, attempts, max_attempts

-- stuck_expired --
-- Leases that expired (outbox_message_lease_idx).
SELECT {{stuck_columns}} FROM outbox_message
WHERE state = 'in_flight' AND lease_expires_at < :now
{{skip_locked}}

-- stuck_abandoned --
-- One lease's rows, whose relay is crashing and gives them up now (abandon).
SELECT {{stuck_columns}} FROM outbox_message
WHERE state = 'in_flight' AND lease_token = :token
{{skip_locked}}

-- stuck_owned --
-- The rows of relay :owner: an earlier run of this relay's id (reclaim_owner), or a relay whose
-- heartbeat stopped (reclaim_dead).
SELECT {{stuck_columns}} FROM outbox_message
WHERE state = 'in_flight' AND lease_owner = :owner
{{skip_locked}}

-- dead_relays --
-- Relays whose last beat is older than :seen_before (never this one), locked: they are deleted
-- (forget_relay) and their rows taken back (stuck_owned) in the same transaction. A relay beating
-- at this moment either beats first (its row is then young enough to stay) or finds its row gone.
SELECT relay_id FROM outbox_relay
WHERE last_seen < :seen_before AND relay_id <> :relay_id
ORDER BY relay_id
{{lock_rows}}

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
-- still names this run. Another relay that finds a row older than --dead-after deletes it and takes
-- back that relay's leases in the same transaction (dead_relays), as an expired lease would be
-- taken, without waiting for the lease. The lease token still guards every write, so a
-- relay that was only slow changes nothing that was taken from it; its next beat finds its row gone
-- and it gives back what it still holds (relay/loop/pulse.py).
UPDATE outbox_relay SET last_seen = {{now}}
WHERE relay_id = :relay_id AND started_at = :started_at

-- ping --
-- The health probe (/readyz): the database answers, and takes writes. A read-only server (a
-- standby in recovery) answering a multi-host URL is not ready: the relay could do nothing there.
SELECT {{read_only}} AS read_only

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

-- doomed --
-- MySQL and SQLite: a purge batch (see postgres.sql's purge_batch), then purge_messages and the
-- dialect's purge_attempts, in one transaction. The locking read sees the latest committed rows
-- (READ COMMITTED on MySQL), so a row replayed to pending is not taken; SKIP LOCKED as on
-- PostgreSQL: a row an operator is replaying, or another purge has, is passed over.
SELECT seq, id FROM outbox_message
WHERE {{eligible}}
ORDER BY id
LIMIT :batch_size
{{skip_locked}}

-- purge_messages --
DELETE FROM outbox_message WHERE {{in_seqs}}
