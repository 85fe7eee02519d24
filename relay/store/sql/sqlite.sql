-- Every statement the relay runs on SQLite, named and commented (relay/store/sqlite.py says which
-- is which). Values are always bound; {{blocking}} and {{resource}} are the store's configuration
-- (relay/store/queries.py).
--
-- SQLite has one writer at a time and no data-modifying CTEs, so what is one statement on
-- PostgreSQL (postgres.sql, where each statement's reasons are given) is a few here, inside one
-- BEGIN IMMEDIATE transaction (relay/store/stepwise.py; those MySQL writes alike are in
-- common.sql): the write lock it takes up front is what keeps two relays from claiming the same
-- row, and what makes the statements inside see and change the same rows.
--
-- SQLite has no time type: times are text in the format SQLAlchemy's DateTime writes
-- ('YYYY-MM-DD HH:MM:SS.ffffff', UTC), so comparisons are plain string order. {{now}} is :now when
-- a test froze time, else SQLite's clock in that same format (to the millisecond: %f is SS.SSS),
-- and a time plus a bound number of seconds is
-- strftime('%Y-%m-%d %H:%M:%f000', coalesce(:now, 'now'), printf('%+.6f seconds', :seconds)).
-- A transaction of several statements reads the time once (common.sql, read_now), so they all
-- agree on it; the statements inside one bind it as :now, which is then never NULL.
--
-- Per-key order: SQLite uses a partial index only where the query names its predicate, so every
-- look at a key's rows names outbox_message_key_idx's own state list ({{blocking_hold}}), and
-- with dead_key "skip" (a shorter {{blocking}}) lets the other states off beside it.

-- now --
coalesce(:now, strftime('%Y-%m-%d %H:%M:%f000', 'now'))

-- in_seqs --
-- :seqs is a JSON array.
seq IN (SELECT value FROM json_each(:seqs))

-- delayed --
strftime('%Y-%m-%d %H:%M:%f000', coalesce(:now, 'now'), printf('%+.6f seconds', :delay_seconds))

-- lease_ends --
strftime('%Y-%m-%d %H:%M:%f000', coalesce(:now, 'now'), printf('%+.6f seconds', :lease_seconds))

-- skip_locked --
/* no row locks in SQLite: the write lock the transaction took (BEGIN IMMEDIATE) covers it */

-- lock_rows --
/* no row locks in SQLite: the write lock the transaction took (BEGIN IMMEDIATE) covers it */

-- transitions --
-- common.sql's update_rows: the rows of the JSON array :rows (a value left out is NULL).
(SELECT json_extract(value, '$.seq') AS seq, json_extract(value, '$.token') AS token,
        json_extract(value, '$.state') AS state, json_extract(value, '$.attempts') AS attempts,
        json_extract(value, '$.available_at') AS available_at,
        json_extract(value, '$.suspect') AS suspect,
        json_extract(value, '$.last_error') AS last_error,
        json_extract(value, '$.keep_expiry') AS keep_expiry
 FROM json_each(:rows)) AS d

-- attempt_rows --
-- common.sql's record_attempts: the rows of the JSON array :records.
(SELECT json_extract(value, '$.message_id') AS message_id,
        json_extract(value, '$.attempt') AS attempt,
        json_extract(value, '$.failure_class') AS failure_class,
        json_extract(value, '$.outcome') AS outcome, json_extract(value, '$.error') AS error,
        json_extract(value, '$.next_at') AS next_at
 FROM json_each(:records)) AS r

-- key_head --
-- No earlier message of m's key in a blocking state (`m`: the row checked, in every statement
-- that checks a head): one probe of outbox_message_key_idx, named by its own state list; with
-- dead_key "skip" the second list (the shorter {{blocking}}) lets the dead off beside it.
NOT EXISTS (
    SELECT 1 FROM outbox_message AS e
    WHERE e.key = m.key AND e.seq < m.seq AND e.state IN ({{blocking_hold}})
      AND e.state IN ({{blocking}})
)

-- ------------------------------------------------------------------------ claiming

-- resource_filter --
-- As postgres.sql's; :exclude is a JSON array.
AND {{resource}} NOT IN (SELECT value FROM json_each(:exclude))
AND (:only IS NULL OR {{resource}} = :only)

-- select_unkeyed --
-- A claim's candidates (relay/store/stepwise.py runs the rest): the unkeyed ones and the keyed
-- ones (select_keyed, with whether each is its key's head), then the runs behind the heads chosen
-- (followers), and common.sql's park, claim_rows and claimed. Per-key order, parking, resources
-- and runs as in postgres.sql's claim; there is no SKIP LOCKED to need, the write lock is already
-- held.
SELECT seq, priority, available_at, {{suspect_columns}}, key
FROM outbox_message
WHERE state = 'pending' AND key IS NULL AND available_at <= :now {{resource_filter}}
ORDER BY priority DESC, available_at, seq
LIMIT :limit

-- select_keyed --
SELECT seq, priority, available_at, {{suspect_columns}}, key, {{key_head}} AS head
FROM outbox_message AS m
WHERE state = 'pending' AND key IS NOT NULL AND NOT held AND available_at <= :now
      {{resource_filter}}
ORDER BY priority DESC, available_at, seq
LIMIT :scan

-- followers --
-- Runs (see postgres.sql's claim): behind each of :heads (a JSON array of seqs, in claim order;
-- the key is read from the head's row, since a BLOB key cannot travel in JSON), the next :run rows
-- of its key in a blocking state, in seq order. SQLite has no LATERAL: a correlated IN with its
-- own LIMIT reads each key's line in outbox_message_key_idx and stops at :run. A run is the
-- prefix whose rows are all ready (`due`); :follow rows at most are kept, numbered in the claim
-- order of their heads.
WITH h AS (
    SELECT j.key AS rank, m.seq, m.key
    FROM json_each(:heads) AS j JOIN outbox_message AS m ON m.seq = j.value
), f AS (
    SELECT e.seq, h.rank,
           (e.state = 'pending' AND e.suspect IS NULL
            AND e.available_at <= :now {{resource_filter}}) AS ok
    FROM h JOIN outbox_message AS e ON e.seq IN (
        SELECT x.seq FROM outbox_message AS x
        WHERE x.key = h.key AND x.seq > h.seq AND x.state IN ({{blocking_hold}})
          AND x.state IN ({{blocking}})
        ORDER BY x.seq
        LIMIT :run
    )
), numbered AS (
    SELECT seq, row_number() OVER (ORDER BY rank, seq) AS n,
           min(ok) OVER (PARTITION BY rank ORDER BY seq) AS due
    FROM f
)
SELECT seq FROM numbered WHERE due AND n <= :follow

-- run_other --
-- The next run of a chain (see postgres.sql's claim_run): followers behind row :after, unless an
-- earlier message of its key :of_key (common.sql, run_key) in a blocking state is not in flight
-- under :token (this statement finds one).
SELECT 1 FROM outbox_message AS e
WHERE e.key = :of_key AND e.seq <= :after
  AND e.state IN ({{blocking_hold}}) AND e.state IN ({{blocking}})
  AND NOT (e.state = 'in_flight' AND e.lease_token = :token)
LIMIT 1

-- has_ready --
-- See postgres.sql.
SELECT EXISTS (
    SELECT 1 FROM outbox_message
    WHERE state = 'pending' AND available_at <= {{now}} AND NOT held AND {{resource}} = :only
)

-- unpark_sweep --
-- See postgres.sql. Its head check names {{blocking}} alone: with dead_key "skip" it does not
-- name outbox_message_key_idx's states as key_head does.
UPDATE outbox_message SET held = false
WHERE seq IN (
    SELECT f.seq FROM (
        {{first_parked}}
    ) AS f
    WHERE NOT EXISTS (
        SELECT 1 FROM outbox_message AS e
        WHERE e.key = f.key AND e.seq < f.seq AND e.state IN ({{blocking}})
    )
)

-- ------------------------------------------------------------------------ settling

-- unpark_next --
-- Unparking, as postgres.sql's mark_published does: for each key just published, its next
-- message in a blocking state after the highest seq published (:lasts, a JSON array of those
-- seqs; the key is read from that row), unparked when it is parked and a head. One probe of
-- outbox_message_key_idx each, and one more for the head check. mark_rows (common.sql) ran first
-- in the same transaction, so the rows it published block nothing any more. While a run is in flight
-- the next message is the run's own: nothing is unparked.
UPDATE outbox_message AS m SET held = false
WHERE m.seq IN (
    SELECT (SELECT n.seq FROM outbox_message AS n
            WHERE n.key = d.key AND n.seq > d.seq AND n.state IN ({{blocking_hold}})
              AND n.state IN ({{blocking}})
            ORDER BY n.seq LIMIT 1)
    FROM json_each(:lasts) AS j JOIN outbox_message AS d ON d.seq = j.value
) AND m.state = 'pending' AND m.held AND {{key_head}}

-- extend_leases --
-- See postgres.sql. :tokens is a JSON array of UUIDs as SQLite stores them (hex).
UPDATE outbox_message
SET lease_expires_at = {{lease_ends}}
WHERE lease_token IN (SELECT value FROM json_each(:tokens)) AND state = 'in_flight'

-- ------------------------------------------------------------------------ resources, relays

-- ensure_resource --
-- A resource's row, made the first time a relay changes it (common.sql, resource_columns).
INSERT INTO outbox_resource (resource) VALUES (:resource) ON CONFLICT DO NOTHING

-- lock_resource --
-- No FOR UPDATE in SQLite: the write lock BEGIN IMMEDIATE took (Dialect.transaction) covers it.
SELECT {{resource_columns}}, {{now}} AS now
FROM outbox_resource WHERE resource = :resource

-- register_relay --
-- See postgres.sql.
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {{now}}, {{now}})
ON CONFLICT (relay_id) DO UPDATE SET started_at = excluded.started_at,
                                     last_seen = excluded.last_seen
RETURNING started_at

-- heartbeat --
INSERT INTO outbox_relay (relay_id, started_at, last_seen) VALUES (:relay_id, {{now}}, {{now}})
ON CONFLICT (relay_id) DO UPDATE SET last_seen = excluded.last_seen

-- relays --
SELECT relay_id, started_at, last_seen FROM outbox_relay
WHERE last_seen > strftime('%Y-%m-%d %H:%M:%f000', coalesce(:now, 'now'),
                           printf('-%.6f seconds', :within))
ORDER BY relay_id

-- pending_summary --
-- See postgres.sql: through the same partial indexes (SQLite uses one when a term of the WHERE
-- clause is a term of its predicate). julianday() reads the stored text; its difference is in
-- days.
SELECT sum(due), sum(later), (julianday({{now}}) - julianday(min(oldest))) * 86400.0
FROM (
    SELECT coalesce(sum(m.available_at <= {{now}}), 0) AS due,
           coalesce(sum(m.available_at > {{now}}), 0) AS later,
           min(CASE WHEN m.available_at <= {{now}} THEN m.available_at END) AS oldest
    FROM outbox_message AS m WHERE {{pending_unkeyed}}
    UNION ALL
    SELECT coalesce(sum(m.available_at <= {{now}}), 0) AS due,
           coalesce(sum(m.available_at > {{now}}), 0) AS later,
           min(CASE WHEN m.available_at <= {{now}} THEN m.available_at END) AS oldest
    FROM outbox_message AS m WHERE {{pending_keyed}}
    UNION ALL
    SELECT coalesce(sum(m.available_at <= {{now}}), 0) AS due,
           coalesce(sum(m.available_at > {{now}}), 0) AS later,
           min(CASE WHEN m.available_at <= {{now}} THEN m.available_at END) AS oldest
    FROM outbox_message AS m WHERE {{pending_parked}}
)

-- ------------------------------------------------------------------------ the console's charts

-- published_minute --
-- Times are text here, so a time's minute is its first 16 characters ('YYYY-MM-DD HH:MM').
substr(published_at, 1, 16)

-- failed_minute --
substr(at, 1, 16)

-- ------------------------------------------------------------------------ retention

-- eligible_states --
state IN (SELECT value FROM json_each(:states))

-- failed_at --
-- The stored times are text in one format, so max() and < compare them as times; a
-- multi-argument max() is NULL if any argument is, hence the coalesce.
max(created_at, coalesce(last_failed_at, created_at), coalesce(replayed_at, created_at))

-- purge_attempts --
-- A purge batch's attempt rows (common.sql, doomed). :ids is a JSON array of message ids as SQLite
-- stores them (32 lowercase hex digits).
DELETE FROM outbox_attempt WHERE message_id IN (SELECT value FROM json_each(:ids))

-- read_only --
-- A file the relay opened takes writes.
0
