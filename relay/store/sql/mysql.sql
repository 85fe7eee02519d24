-- Every statement the relay runs on MySQL 8.0+ and MariaDB 10.6+, named and commented
-- (relay/store/mysql.py says which is which). Values are always bound; {{resource}}, and the
-- key_head, trails and other_probes of the dead-key mode, are the store's configuration
-- (relay/store/queries.py).
--
-- These servers have SKIP LOCKED but neither UPDATE ... RETURNING nor data-modifying CTEs, and
-- MySQL cannot UPDATE a table it reads in a subquery of the same statement. So what is one
-- statement on PostgreSQL (postgres.sql, where each statement's reasons are given) is a few here,
-- in one short READ COMMITTED transaction (relay/store/stepwise.py; those SQLite writes alike are
-- in common.sql): a locking read (FOR UPDATE, SKIP LOCKED where relays compete) picks the rows,
-- then plain UPDATEs by primary key change them. The row locks, held to the COMMIT, are what keep
-- two relays off the same row.
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

-- in_seqs --
seq IN :seqs

-- delayed --
TIMESTAMPADD(MICROSECOND, ROUND(:delay_seconds * 1000000), {{now}})

-- lease_ends --
TIMESTAMPADD(MICROSECOND, ROUND(:lease_seconds * 1000000), {{now}})

-- skip_locked --
FOR UPDATE SKIP LOCKED

-- lock_rows --
FOR UPDATE

-- attempt_rows --
-- common.sql's record_attempts: the rows of the JSON array :records (a value left out is NULL).
JSON_TABLE(:records, '$[*]' COLUMNS (
    message_id CHAR(32) PATH '$.message_id', attempt INT PATH '$.attempt',
    failure_class VARCHAR(32) PATH '$.failure_class', outcome VARCHAR(16) PATH '$.outcome',
    error LONGTEXT PATH '$.error', next_at DATETIME(6) PATH '$.next_at')) AS r

-- update_rows_join --
-- common.sql's update_rows, as MySQL updates from another table: with a JOIN, and every column it
-- sets named with its table.
UPDATE outbox_message AS m
JOIN JSON_TABLE(:rows, '$[*]' COLUMNS (
    seq BIGINT PATH '$.seq', token CHAR(32) PATH '$.token', state VARCHAR(16) PATH '$.state',
    attempts INT PATH '$.attempts', available_at DATETIME(6) PATH '$.available_at',
    suspect VARCHAR(8) PATH '$.suspect', last_error LONGTEXT PATH '$.last_error',
    keep_expiry INT PATH '$.keep_expiry')) AS d ON d.seq = m.seq
SET m.state = d.state, m.attempts = d.attempts,
    m.available_at = coalesce(d.available_at, m.available_at), m.suspect = d.suspect,
    m.last_error = d.last_error, m.last_failed_at = {{now}},
    m.lease_owner = NULL, m.lease_token = NULL,
    m.lease_expires_at = CASE WHEN d.keep_expiry = 1 THEN m.lease_expires_at END
WHERE m.lease_token = d.token AND m.state = 'in_flight'

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
-- claiming right now is not a candidate. A keyed row becomes a head or is parked (heads, then
-- common.sql's park), as on PostgreSQL; at most :scan rows are looked at.
SELECT seq, `key`, {{suspect_columns}}
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
        (suspect IS NULL AND available_at <= {{now}} {{resource_filter}}) AS ok
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
WHERE seq IN :seqs AND state = 'pending' AND suspect IS NULL AND available_at <= {{now}}
  {{resource_filter}}
FOR UPDATE SKIP LOCKED

-- run_other --
-- The next run of a chain (see postgres.sql's claim_run): the runs' statements behind row
-- :after, unless an earlier message of its key :of_key (common.sql, run_key) in a blocking state is
-- not in flight under :token (per state, one probe of outbox_message_key_state_idx; in flight,
-- this lease's rows, a chain or two, are let off).
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
        {{first_parked}}
    ) AS m
    WHERE {{key_head}}
) AS u ON t.seq = u.seq
SET t.held = false

-- ------------------------------------------------------------------------ settling

-- unpark_next --
-- Unparking, as postgres.sql's mark_published does, after mark_rows in the same transaction
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
SET lease_expires_at = {{lease_ends}}
WHERE lease_token IN :tokens AND state = 'in_flight'

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

-- purge_attempts --
DELETE FROM outbox_attempt WHERE message_id IN :ids

-- read_only --
-- Whether the server takes writes is not asked on MySQL (the probe only checks it answers).
0
