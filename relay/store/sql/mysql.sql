-- Every statement the relay runs on MySQL 8.0+ and MariaDB 10.6+, named and commented
-- (relay/store/mysql.py says which is which). Values are always bound; {{resource}}, and the
-- key_head, trails and other_probes of the dead-key mode, are the store's configuration
-- (relay/store/queries.py).
--
-- These servers have SKIP LOCKED but neither UPDATE ... RETURNING nor data-modifying CTEs, and
-- MySQL cannot UPDATE a table it reads in a subquery of the same statement. So what is one
-- statement on PostgreSQL (postgres.sql, where each statement's reasons are given) is a few here,
-- in one short READ COMMITTED transaction: a locking read (FOR UPDATE, SKIP LOCKED where relays
-- compete) picks the rows, then plain UPDATEs by primary key change them. The row locks, held to
-- the COMMIT, are what keep two relays off the same row.
--
-- Times are DATETIME(6) in UTC: {{now}} is :now when a test froze time, else UTC_TIMESTAMP(6),
-- the server's clock (enqueue stamps rows with it too, so the relay and the application agree).
-- Durations are bound in seconds and added as microseconds:
-- TIMESTAMPADD(MICROSECOND, ROUND(:seconds * 1000000), {{now}}).
--
-- Lists are bound as SQLAlchemy's expanding parameters (`seq IN :seqs` becomes
-- `seq IN (1, 2, 3)`): primary-key lookups every server plans well. `key` is a reserved word
-- here: unqualified, it is quoted.

-- now --
coalesce(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))

-- leased --
-- The lease guard: see postgres.sql.
seq IN :seqs AND lease_token = :token AND state = 'in_flight'

-- delayed --
TIMESTAMPADD(MICROSECOND, ROUND(:delay_seconds * 1000000), {{now}})

-- ------------------------------------------------------------------------ per-key order

-- key_head_hold --
-- The head check (postgres.sql's claim) in the form MySQL runs in constant time: per blocking
-- state, the key's first row in that state (one probe of outbox_message_key_state_idx, read in
-- seq order and stopped at once), earlier than the row checked or not: `m`, in every statement
-- that checks a head. As one NOT EXISTS over the states, MySQL and MariaDB read every row of the
-- key, published ones included. With dead_key "skip", key_head_skip: the same without the dead.
(coalesce((SELECT e.seq FROM outbox_message AS e
               FORCE INDEX (outbox_message_key_state_idx)
               WHERE e.key = m.key AND e.state = 'pending'
               ORDER BY e.seq LIMIT 1), m.seq) >= m.seq
    AND coalesce((SELECT e.seq FROM outbox_message AS e
               FORCE INDEX (outbox_message_key_state_idx)
               WHERE e.key = m.key AND e.state = 'in_flight'
               ORDER BY e.seq LIMIT 1), m.seq) >= m.seq
    AND coalesce((SELECT e.seq FROM outbox_message AS e
               FORCE INDEX (outbox_message_key_state_idx)
               WHERE e.key = m.key AND e.state = 'dead'
               ORDER BY e.seq LIMIT 1), m.seq) >= m.seq)

-- key_head_skip --
(coalesce((SELECT e.seq FROM outbox_message AS e
               FORCE INDEX (outbox_message_key_state_idx)
               WHERE e.key = m.key AND e.state = 'pending'
               ORDER BY e.seq LIMIT 1), m.seq) >= m.seq
    AND coalesce((SELECT e.seq FROM outbox_message AS e
               FORCE INDEX (outbox_message_key_state_idx)
               WHERE e.key = m.key AND e.state = 'in_flight'
               ORDER BY e.seq LIMIT 1), m.seq) >= m.seq)

-- ------------------------------------------------------------------------ claiming

-- resource_filter --
AND {{resource}} NOT IN :exclude
AND (:only IS NULL OR {{resource}} = :only)

-- candidates --
-- The candidates, best first, locked: ready rows in claim order, keyed and unkeyed together, read
-- along outbox_message_claim_idx (outbox/databases.py). SKIP LOCKED: a row another relay is
-- claiming right now is not a candidate. A keyed row becomes a head or is parked (heads, park),
-- as on PostgreSQL; at most :scan rows are looked at.
SELECT seq, `key`, lease_expires_at IS NOT NULL AS suspect,
       lease_expires_at IS NOT NULL AND last_error = :solitary AS solitary
FROM outbox_message FORCE INDEX (outbox_message_claim_idx)
WHERE state = 'pending' AND held = false AND available_at <= {{now}} {{resource_filter}}
ORDER BY priority DESC, available_at, seq
LIMIT :scan
FOR UPDATE SKIP LOCKED

-- heads --
-- Which of the keyed candidates have nothing earlier of their key in a blocking state: a plain
-- read (the latest committed rows), probing outbox_message_key_state_idx (key_head).
SELECT m.seq FROM outbox_message AS m
WHERE m.seq IN :seqs AND {{key_head}}

-- park --
UPDATE outbox_message SET held = true WHERE seq IN :seqs

-- trailed --
-- Runs (see postgres.sql's claim), in two plain reads; the rows a run keeps are locked after them
-- (lock_followers). First, which of the heads chosen have anything of their key behind them in a
-- blocking state ({{trails}}: per state, one probe of outbox_message_key_state_idx, as
-- key_head): most have nothing, and a branch of followers costs its parse even when it finds
-- nothing.
SELECT m.seq FROM outbox_message AS m WHERE m.seq IN :seqs AND ({{trails}})

-- trails_hold --
EXISTS (SELECT 1 FROM outbox_message AS e
            FORCE INDEX (outbox_message_key_state_idx)
            WHERE e.key = m.key AND e.state = 'pending' AND e.seq > m.seq)
    OR EXISTS (SELECT 1 FROM outbox_message AS e
            FORCE INDEX (outbox_message_key_state_idx)
            WHERE e.key = m.key AND e.state = 'in_flight' AND e.seq > m.seq)
    OR EXISTS (SELECT 1 FROM outbox_message AS e
            FORCE INDEX (outbox_message_key_state_idx)
            WHERE e.key = m.key AND e.state = 'dead' AND e.seq > m.seq)

-- trails_skip --
EXISTS (SELECT 1 FROM outbox_message AS e
            FORCE INDEX (outbox_message_key_state_idx)
            WHERE e.key = m.key AND e.state = 'pending' AND e.seq > m.seq)
    OR EXISTS (SELECT 1 FROM outbox_message AS e
            FORCE INDEX (outbox_message_key_state_idx)
            WHERE e.key = m.key AND e.state = 'in_flight' AND e.seq > m.seq)

-- follower_ready --
-- Then, behind each of those, the next :run rows of its key in a blocking state. MariaDB has no
-- LATERAL and neither server takes a LIMIT in an IN subquery, hence a UNION of branches, two per
-- head: its pending rows, a range of outbox_message_key_state_idx read in seq order and stopped
-- at :run (one range over all the states would be a hot key's whole backlog, read and sorted),
-- with whether each is ready; and its rows in the other blocking states (follower_blocked: few,
-- and never ready). mysql.RUN_HEADS heads a statement; {{i}} is the head's place in it, a number
-- the statement is built with.
(SELECT {{i}} AS head, seq,
        (lease_expires_at IS NULL AND available_at <= {{now}} {{resource_filter}}) AS ok
 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :key_{{i}} AND state = 'pending' AND seq > :seq_{{i}}
 ORDER BY seq LIMIT :run)

-- follower_blocked --
-- {{others}}: the blocking states but pending, a literal list of the dead-key mode.
(SELECT {{i}} AS head, seq, false AS ok
 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :key_{{i}} AND state IN ({{others}}) AND seq > :seq_{{i}}
 ORDER BY seq LIMIT :run)

-- lock_followers --
-- The rows the runs would take, locked where no other claim holds them. A row skipped (locked) or
-- no longer ready since the plain read ends its run there: what comes after it stays behind it.
SELECT seq FROM outbox_message
WHERE seq IN :seqs AND state = 'pending' AND lease_expires_at IS NULL AND available_at <= {{now}}
  {{resource_filter}}
FOR UPDATE SKIP LOCKED

-- claim --
-- The chosen rows, locked since candidates, and their runs, since lock_followers (a run's rows
-- are usually parked: held is cleared). :suspect and :stamp as in sqlite.sql's claim.
UPDATE outbox_message
SET state = 'in_flight',
    held = false,
    attempts = attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = TIMESTAMPADD(MICROSECOND, ROUND(:lease_seconds * 1000000), {{now}}),
    last_error = CASE WHEN :suspect THEN :stamp ELSE last_error END
WHERE seq IN :seqs

-- run_key --
-- The next run of a chain (see postgres.sql's claim_run): the runs' statements behind row
-- :after, unless an earlier message of its key in a blocking state is not in flight under :token
-- (run_other: per state, one probe of outbox_message_key_state_idx; in flight, this lease's rows,
-- a chain or two, are let off).
SELECT `key` FROM outbox_message WHERE seq = :after

-- run_other --
{{other_probes}}

-- other_probes_hold --
(SELECT 1 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :of_key AND state = 'pending' AND seq <= :after LIMIT 1)
UNION ALL
(SELECT 1 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :of_key AND state = 'in_flight' AND seq <= :after AND NOT (lease_token <=> :token) LIMIT 1)
UNION ALL
(SELECT 1 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :of_key AND state = 'dead' AND seq <= :after LIMIT 1)

-- other_probes_skip --
(SELECT 1 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :of_key AND state = 'pending' AND seq <= :after LIMIT 1)
UNION ALL
(SELECT 1 FROM outbox_message FORCE INDEX (outbox_message_key_state_idx)
 WHERE `key` = :of_key AND state = 'in_flight' AND seq <= :after AND NOT (lease_token <=> :token) LIMIT 1)

-- claimed --
SELECT seq, id, exchange, routing_key, payload, content_type, headers, `key`,
       priority, attempts, max_attempts, available_at, created_at, traceparent,
       tracestate, :suspect AS suspect
FROM outbox_message WHERE seq IN :seqs

-- has_ready --
-- See postgres.sql.
SELECT EXISTS (
    SELECT 1 FROM outbox_message
    WHERE state = 'pending' AND held = false AND available_at <= {{now}}
      AND {{resource}} = :only
)

-- unpark_sweep --
-- See postgres.sql: the same heads (key_head), through a materialised derived table (see
-- unpark_next).
UPDATE outbox_message AS t
JOIN (
    SELECT m.seq FROM (
        SELECT `key`, min(seq) AS seq FROM outbox_message
        WHERE state = 'pending' AND held AND `key` IS NOT NULL
        GROUP BY `key`
    ) AS m
    WHERE {{key_head}}
) AS u ON t.seq = u.seq
SET t.held = false

-- ------------------------------------------------------------------------ settling

-- keys_of --
-- The keyed rows about to be marked, locked, with their keys (read before mark_published clears
-- their lease): mark_published then publishes exactly these.
SELECT seq, `key` FROM outbox_message
WHERE {{leased}} AND `key` IS NOT NULL
FOR UPDATE

-- mark_published --
-- Lease-guarded: see postgres.sql's mark_published.
UPDATE outbox_message
SET state = 'published', published_at = {{now}}, last_error = NULL,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE {{leased}}

-- unpark_next --
-- Unparking, as postgres.sql's mark_published does, after mark_published in the same transaction
-- (the rows it published block nothing any more): for each key just published, its first pending
-- message after the highest seq published (:lasts; the key is read from that row), one probe of
-- outbox_message_key_state_idx, unparked when it is parked and a head (key_head). That is
-- PostgreSQL's rule: when the key's next message in a blocking state is not that pending one but
-- an earlier row (in flight, dead), the head check fails on that row; and a pending row is found
-- by a probe of its own state, where one over every blocking state would read and sort the rest
-- of a hot key's line. While a run is in flight nothing is unparked. The derived tables are
-- materialised (the inner one is DISTINCT), which is what lets MySQL update the table they read.
UPDATE outbox_message AS t
JOIN (
    SELECT m.seq FROM (
        SELECT DISTINCT d.`key`, (SELECT p.seq FROM outbox_message AS p
                                  FORCE INDEX (outbox_message_key_state_idx)
                                  WHERE p.key = d.key AND p.state = 'pending' AND p.seq > d.seq
                                  ORDER BY p.seq LIMIT 1) AS seq
        FROM outbox_message AS d
        WHERE d.seq IN :lasts
    ) AS m
    WHERE {{key_head}}
) AS u ON t.seq = u.seq
SET t.held = false
WHERE t.held AND t.state = 'pending'

-- extend_leases --
-- See postgres.sql. :tokens are UUIDs as stored (32 hex digits).
UPDATE outbox_message
SET lease_expires_at = TIMESTAMPADD(MICROSECOND, ROUND(:lease_seconds * 1000000), {{now}})
WHERE lease_token IN :tokens AND state = 'in_flight'

-- held --
-- Failed attempts (see postgres.sql's settle_failures): the rows this lease still holds, locked,
-- then settle_one for each and one record_attempt for them all.
SELECT seq, id, attempts FROM outbox_message
WHERE {{leased}}
FOR UPDATE

-- settle_one --
UPDATE outbox_message
SET state = :state,
    available_at = coalesce(CAST(:available_at AS DATETIME(6)), available_at),
    attempts = attempts - :unburn,
    last_error = :error,
    last_failed_at = {{now}},
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE seq = :seq

-- record_attempt --
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
VALUES (:message_id, :attempt, {{now}}, :relay_id, :failure_class, :outcome, :error, :next_at)

-- ------------------------------------------------------------------------ taking leases back

-- reclaimable --
-- Taking leases back (relay/core/suspects.py decides what becomes of each row; postgres.sql's
-- reclaim says when). The rows, locked (SKIP LOCKED: two relays reclaiming at once take disjoint
-- rows), with what the decision reads and the server's time, which the rest of the transaction
-- binds as :now; then reclaim once per distinct change, and one record_attempt for them all.
-- {{where}} picks the rows: an expired lease, one token's (abandon), an earlier run's, dead
-- relays'.
SELECT seq, id, lease_owner, last_error, attempts, max_attempts, {{now}} AS now
FROM outbox_message
WHERE state = 'in_flight' AND {{where}}
FOR UPDATE SKIP LOCKED

-- reclaim --
-- Only rows the read above locked, still in flight.
UPDATE outbox_message
SET state = :state, attempts = :attempts, last_error = :last_error, last_failed_at = {{now}},
    lease_owner = NULL, lease_token = NULL  -- lease_expires_at stays: the suspect's mark
WHERE seq IN :seqs AND state = 'in_flight'

-- reclaim_expired --
lease_expires_at < {{now}}

-- abandoned --
lease_token = :token

-- reclaim_owner --
lease_owner = :relay_id

-- reclaim_dead --
-- See postgres.sql's reclaim_dead: the dead relays are read, locked and deleted first
-- (dead_relays, forget_relays), in the same transaction.
lease_owner IN :relays

-- dead_relays --
SELECT relay_id FROM outbox_relay
WHERE last_seen < TIMESTAMPADD(MICROSECOND, ROUND(:dead_after_neg * 1000000), {{now}})
  AND relay_id <> :relay_id
ORDER BY relay_id
FOR UPDATE

-- forget_relays --
DELETE FROM outbox_relay WHERE relay_id IN :relays

-- ------------------------------------------------------------------------ resources, relays

-- lock_resource --
-- Under the row lock (inside Dialect.transaction), with the server's time.
SELECT {{resource_columns}}, {{now}} AS now
FROM outbox_resource WHERE resource = :resource FOR UPDATE

-- ensure_resource --
-- ON DUPLICATE KEY UPDATE of nothing, not INSERT IGNORE: IGNORE would also cut a name longer than
-- the column down to size, silently, and two such names would share one row.
INSERT INTO outbox_resource (resource) VALUES (:resource)
ON DUPLICATE KEY UPDATE resource = resource

-- heartbeat --
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {{now}}, {{now}})
ON DUPLICATE KEY UPDATE last_seen = VALUES(last_seen)

-- register_relay --
-- See postgres.sql: the row, then its started_at read back (started_at, in one transaction).
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {{now}}, {{now}})
ON DUPLICATE KEY UPDATE started_at = VALUES(started_at), last_seen = VALUES(last_seen)

-- started_at --
SELECT started_at FROM outbox_relay WHERE relay_id = :relay_id

-- relays --
SELECT relay_id, started_at, last_seen FROM outbox_relay
WHERE last_seen > TIMESTAMPADD(MICROSECOND, -ROUND(:within * 1000000), {{now}})
ORDER BY relay_id

-- pending_summary --
-- See postgres.sql; the age in seconds, to the microsecond.
SELECT coalesce(sum(available_at <= {{now}}), 0),
       coalesce(sum(available_at > {{now}}), 0),
       TIMESTAMPDIFF(MICROSECOND,
                     min(CASE WHEN available_at <= {{now}} THEN available_at END), {{now}}) / 1e6
FROM outbox_message
WHERE state = 'pending'

-- ------------------------------------------------------------------------ the console's charts

-- published_minute --
-- A time's minute as text, in the form SQLite's is ('YYYY-MM-DD HH:MM', UTC).
DATE_FORMAT(published_at, '%Y-%m-%d %H:%i')

-- failed_minute --
DATE_FORMAT(at, '%Y-%m-%d %H:%i')

-- ------------------------------------------------------------------------ retention

-- eligible_states --
state IN :states

-- failed_at --
-- greatest() is NULL if any argument is, hence the coalesce.
greatest(created_at, coalesce(last_failed_at, created_at), coalesce(replayed_at, created_at))

-- doomed --
-- A batch: the rows, locked (SKIP LOCKED as on PostgreSQL: a row an operator is replaying, or
-- another purge has, is passed over), then both DELETEs, in one transaction. The locking read
-- sees the latest committed rows (READ COMMITTED), so a row replayed to pending is not taken.
SELECT seq, id FROM outbox_message
WHERE {{eligible}}
ORDER BY id
LIMIT :batch_size
FOR UPDATE SKIP LOCKED

-- purge_messages --
DELETE FROM outbox_message WHERE seq IN :seqs

-- purge_attempts --
DELETE FROM outbox_attempt WHERE message_id IN :ids
