-- Every statement the relay runs on PostgreSQL, named and commented (relay/store/postgres.py says
-- which is which). Values are always bound; {{blocking}} and {{resource}} are the store's
-- configuration (relay/store/queries.py).
--
-- Each runs as a single statement in autocommit mode: one round trip, and no transaction left open
-- between a claim and its settlement (the lease, not a lock, protects the row in between). The
-- exceptions are a resource change (circuits, rate buckets), a read and a write under FOR UPDATE,
-- and taking leases back, the same short transaction on every database (common.sql,
-- stuck_columns).
--
-- `coalesce(:now, now())` is the time everywhere: :now is NULL in production, so it is the server's
-- clock, the one clock every relay shares; tests bind a frozen time.
--
-- Per-key order: a key's head is its first message in a blocking state. Every look at a key's own
-- rows (the head check, a run, the next message in mark_published, the sweep) reads
-- outbox_message_key_idx in (key, seq) order, the key given as a range:
--
--     coalesce((SELECT e.seq FROM outbox_message AS e
--               WHERE e.key >= m.key AND e.key <= m.key AND e.state IN ({{blocking}})
--               ORDER BY e.key, e.seq LIMIT 1), m.seq) >= m.seq
--
-- is "no earlier message of m's key blocks it", read in key order and stopped at once. As a NOT
-- EXISTS (or any lookup of a key's rows by seq), the planner may walk the primary key instead,
-- filtering on the key, through every published row on the way: it does when the statistics were
-- taken during a burst (every row pending, one key: the key looks like the whole table). A hot
-- key's claim then costs more with every published row. A range on the key (not an equality, which
-- the planner would drop from the order) keeps the key in the sort order, which no other index
-- gives: any other plan would have to read and sort the whole key, so it is never chosen.

-- now --
-- The time (common.sql's statements take it from here).
coalesce(:now, now())

-- in_seqs --
-- The rows of :seqs, a bigint[]: one probe of the primary key each.
seq = ANY(CAST(:seqs AS bigint[]))

-- delayed --
-- :delay_seconds from now.
{{now}} + make_interval(secs => :delay_seconds)

-- lease_ends --
-- When a lease taken or extended now runs out.
coalesce(:now, now()) + make_interval(secs => :lease_seconds)

-- skip_locked --
FOR UPDATE SKIP LOCKED

-- lock_rows --
FOR UPDATE

-- transitions --
-- common.sql's update_rows: the rows of the JSON array :rows. Its times are UTC digits.
(SELECT seq, token, state, attempts, available_at AT TIME ZONE 'UTC' AS available_at, suspect,
        last_error, keep_expiry
 FROM json_to_recordset(CAST(:rows AS json))
      AS x(seq bigint, token uuid, state text, attempts int, available_at timestamp,
           suspect text, last_error text, keep_expiry int)) AS d

-- attempt_rows --
-- common.sql's record_attempts: the rows of the JSON array :records.
(SELECT message_id, attempt, failure_class, outcome, error, next_at AT TIME ZONE 'UTC' AS next_at
 FROM json_to_recordset(CAST(:records AS json))
      AS x(message_id uuid, attempt int, failure_class text, outcome text, error text,
           next_at timestamp)) AS r

-- ------------------------------------------------------------------------ claiming

-- resource_filter --
-- Rows of the resources in :exclude (open circuits, rate-limited destinations) are passed by, so
-- they never take a place in a batch; :only, when not null, claims for that one resource (a
-- probe, or the share a rate limit allows). {{resource}} is the row's part of its resource name
-- (common.RESOURCE_PARTS), computed in the WHERE clause so that an excluded resource's rows are
-- passed by inside the index scan.
AND NOT ({{resource}} = ANY(CAST(:exclude AS text[])))
AND (CAST(:only AS text) IS NULL OR {{resource}} = CAST(:only AS text))

-- claim --
-- Take up to :limit ready rows, highest priority first, then the longest due, then enqueue order
-- (the order of the two ready indexes, so these are index range scans however many published rows
-- the table holds). SKIP LOCKED lets concurrent relays claim disjoint rows without waiting for
-- each other: a row another relay is claiming right now is simply not a candidate.
--
-- Per-key order: a keyed row is claimed only while no earlier row of its key blocks it (`head`),
-- or in its head's run (below), so one relay at a time holds a key's messages, and a failing
-- message holds back only its own key. A keyed row found to have an earlier blocking one is
-- *parked* (held = true): it leaves the ready index, so a key with thousands of messages queued
-- behind its head costs later claims nothing. mark_published unparks the next message of each key
-- it settles; unpark_sweep catches every other way a key comes free. At most :scan keyed
-- candidates are looked at per claim.
--
-- Suspects (relay/core/suspects.py): a pending row whose suspect column is set is one whose last
-- lease ended unsettled, its relay having died holding it. When the best :limit candidates
-- include one to be claimed alone ('alone'), the claim takes the first of those alone; else, when
-- they include suspects, it takes up to :group of them and nothing else. Their suspect column
-- stays as it is; for relays of schema 6, last_error says :alone or :grouped. The relay publishes
-- such a claim with nothing else in flight, so a message that kills its relay can only take its
-- fellow suspects down, and once alone only itself.
--
-- Runs (hot keys): behind each keyed head claimed (not a suspect), the next :run messages of its
-- key are claimed under the same lease, as long as each is pending, due, not a suspect, passes the
-- resource filter and is not locked by another claim: the prefix of its key's line that would
-- become heads one after another (a run stops at the first that would not). `follow` is the next
-- :run rows of each head's key in a blocking state, each with whether a run may take it (`ok`);
-- `locked` and `run` lock them where no other claim holds them, and cut each run at its first row
-- that is not: what comes after it stays behind it. The relay publishes a run one message at a
-- time, each once the one before it is confirmed, and gives the rest back on any failure
-- (relay/loop/chains.py), so a key's order holds while its backlog drains at the broker's confirm
-- pace instead of one claim-publish-mark cycle per message. :follow caps the rows all runs of a
-- claim add together. A run's rows are usually parked: held is cleared with the lease.
--
-- The rows to lease are named by an array of seqs (one probe of the primary key each), not
-- joined, and the runs are cut at :follow by a LIMIT: the planner cannot tell how many rows the
-- runs add, and a claim it thinks large becomes a hash join over the whole table, or is compiled
-- by JIT for longer than it runs. The last column says whether a row is a suspect.
WITH unkeyed AS (
    SELECT seq, NULL::text AS key, priority, available_at, {{suspect_columns}}
    FROM outbox_message
    WHERE state = 'pending' AND key IS NULL AND available_at <= coalesce(:now, now())
          {{resource_filter}}
    ORDER BY priority DESC, available_at, seq
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), keyed AS (
    SELECT seq, key, priority, available_at, {{suspect_columns}},
           coalesce((
               SELECT e.seq FROM outbox_message AS e
               WHERE e.key >= m.key AND e.key <= m.key AND e.state IN ({{blocking}})
               ORDER BY e.key, e.seq LIMIT 1
           ), m.seq) >= m.seq AS head
    FROM outbox_message AS m
    WHERE state = 'pending' AND key IS NOT NULL AND NOT held
      AND available_at <= coalesce(:now, now()) {{resource_filter}}
    ORDER BY priority DESC, available_at, seq
    LIMIT :scan
    FOR UPDATE SKIP LOCKED
), ready AS (
    SELECT seq, key, priority, available_at, suspect, solitary FROM (
        SELECT seq, key, priority, available_at, suspect, solitary FROM unkeyed
        UNION ALL
        SELECT seq, key, priority, available_at, suspect, solitary FROM keyed WHERE head
    ) AS both_kinds
    ORDER BY priority DESC, available_at, seq
    LIMIT :limit
), chosen AS (
    SELECT seq, key, suspect, solitary, priority, available_at FROM ready
    WHERE NOT EXISTS (SELECT 1 FROM ready WHERE suspect)
    UNION ALL
    (SELECT seq, key, suspect, solitary, priority, available_at FROM ready WHERE solitary
     ORDER BY priority DESC, available_at, seq LIMIT 1)
    UNION ALL
    (SELECT seq, key, suspect, solitary, priority, available_at FROM ready
     WHERE suspect AND NOT EXISTS (SELECT 1 FROM ready WHERE solitary)
     ORDER BY priority DESC, available_at, seq LIMIT :group)
), follow AS (
    SELECT f.seq, f.key,
           row_number() OVER (ORDER BY h.rank, f.seq) AS n,
           bool_and(f.ok) OVER (PARTITION BY f.key ORDER BY f.seq) AS due
    FROM (
        SELECT seq, key, row_number() OVER (ORDER BY priority DESC, available_at, seq) AS rank
        FROM chosen WHERE key IS NOT NULL AND NOT suspect
    ) AS h
    CROSS JOIN LATERAL (
        SELECT e.seq, e.key,
               (e.state = 'pending' AND e.suspect IS NULL
                AND e.available_at <= coalesce(:now, now()) {{resource_filter}}) AS ok
        FROM outbox_message AS e
        WHERE e.key >= h.key AND e.key <= h.key AND e.seq > h.seq
          AND e.state IN ({{blocking}})
        ORDER BY e.key, e.seq
        LIMIT :run
    ) AS f
    ORDER BY n
    LIMIT :follow
), {{runs_locked}}, parked AS (
    UPDATE outbox_message AS p SET held = true
    FROM keyed
    WHERE p.seq = keyed.seq AND NOT keyed.head AND keyed.seq NOT IN (SELECT seq FROM run)
    RETURNING p.seq
)
UPDATE outbox_message AS m
SET state = 'in_flight',
    held = false,
    attempts = m.attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = {{lease_ends}},
    last_error = CASE WHEN m.seq = ANY(ARRAY(SELECT seq FROM chosen WHERE solitary)) THEN :alone
                      WHEN m.seq = ANY(ARRAY(SELECT seq FROM chosen WHERE suspect)) THEN :grouped
                      ELSE m.last_error END
WHERE m.seq = ANY(ARRAY(SELECT seq FROM chosen UNION ALL SELECT seq FROM run))
RETURNING m.seq, m.id::text, m.exchange, m.routing_key, m.payload, m.content_type,
          m.headers, m.key, m.priority, m.attempts, m.max_attempts, m.available_at,
          m.created_at, m.traceparent, m.tracestate, m.suspect IS NOT NULL

-- runs_locked --
-- The claim's and claim_run's runs: the rows of `follow` a run may take, locked where no other
-- claim holds them (`locked`), and each run cut at its first row that is not (`run`).
locked AS (
    SELECT seq FROM outbox_message
    WHERE seq = ANY(ARRAY(SELECT seq FROM follow WHERE due)) AND state = 'pending'
    FOR UPDATE SKIP LOCKED
), run AS (
    SELECT seq FROM (
        SELECT f.seq,
               bool_and(l.seq IS NOT NULL) OVER (PARTITION BY f.key ORDER BY f.seq) AS whole
        FROM follow AS f LEFT JOIN locked AS l ON l.seq = f.seq
        WHERE f.due
    ) AS r
    WHERE whole
)

-- claim_run --
-- The next run of a chain the relay is sending (relay/loop/chains.py): the next :run messages of
-- the key of row :after, leased to the chain's own :token while the chain is still being
-- published, so the key's next message goes out as soon as the chain's last one is confirmed, with
-- no mark and claim in between. Only while every earlier message of the key in a blocking state is
-- in flight under :token (`other`: a lease taken over, or a message given back, ends the chain);
-- then as a run of the claim (`follow`, `locked`, `run` and the lease are the claim's): the prefix
-- that is pending, due, not a suspect, passes the resource filter and is not locked by another
-- claim.
WITH k AS (
    SELECT key FROM outbox_message WHERE seq = :after AND key IS NOT NULL
), other AS (
    SELECT 1 FROM k CROSS JOIN LATERAL (
        SELECT 1 FROM outbox_message AS e
        WHERE e.key >= k.key AND e.key <= k.key AND e.seq <= :after AND e.state IN ({{blocking}})
          AND NOT (e.state = 'in_flight' AND e.lease_token = :token)
        ORDER BY e.key, e.seq
        LIMIT 1
    ) AS x
), follow AS (
    SELECT f.seq, f.key, bool_and(f.ok) OVER (ORDER BY f.seq) AS due
    FROM k CROSS JOIN LATERAL (
        SELECT e.seq, e.key,
               (e.state = 'pending' AND e.suspect IS NULL
                AND e.available_at <= coalesce(:now, now()) {{resource_filter}}) AS ok
        FROM outbox_message AS e
        WHERE e.key >= k.key AND e.key <= k.key AND e.seq > :after
          AND e.state IN ({{blocking}})
        ORDER BY e.key, e.seq
        LIMIT :run
    ) AS f
    WHERE NOT EXISTS (SELECT 1 FROM other)
), {{runs_locked}}
UPDATE outbox_message AS m
SET state = 'in_flight',
    held = false,
    attempts = m.attempts + 1,
    lease_owner = :owner,
    lease_token = :token,
    lease_expires_at = {{lease_ends}}
WHERE m.seq = ANY(ARRAY(SELECT seq FROM run)) AND m.state = 'pending'
RETURNING m.seq, m.id::text, m.exchange, m.routing_key, m.payload, m.content_type,
          m.headers, m.key, m.priority, m.attempts, m.max_attempts, m.available_at,
          m.created_at, m.traceparent, m.tracestate, false

-- has_ready --
-- Whether a resource has a message a probe could take (checked before taking the probe, so an
-- idle resource is not probed with nothing and its circuit stays open until a message comes).
SELECT EXISTS (
    SELECT 1 FROM outbox_message
    WHERE state = 'pending' AND available_at <= coalesce(:now, now()) AND NOT held
      AND {{resource}} = :only
)

-- unpark_sweep --
-- The first parked message of every key is unparked when nothing earlier blocks it any more:
-- heads that were dead-lettered (with dead_key="skip"), cancelled or discarded. Settling a message
-- unparks the next of its key at once (mark_published); this sweep catches every other way a key
-- comes free. One probe per key with parked messages: the relay runs it every few seconds as a
-- safety net, an operator command after cancelling or discarding.
UPDATE outbox_message SET held = false
WHERE seq IN (
    SELECT f.seq FROM (
        {{first_parked}}
    ) AS f
    WHERE coalesce((
        SELECT e.seq FROM outbox_message AS e
        WHERE e.key >= f.key AND e.key <= f.key AND e.state IN ({{blocking}})
        ORDER BY e.key, e.seq LIMIT 1
    ), f.seq) >= f.seq
)

-- ------------------------------------------------------------------------ settling

-- mark_published --
-- common.sql's mark_rows (lease-guarded), then unparking: for each key just published, the next message of the key in a blocking state (one
-- probe of outbox_message_key_idx) is unparked when it is parked and nothing earlier blocks it
-- but what this statement publishes. While a run is in flight the next message is the run's own,
-- in flight: nothing is unparked, and no claim has to park it again. The check that nothing earlier
-- blocks runs only for a next message that is parked (`nexts` is materialized first). Both read
-- outbox_message_key_idx in key order (see the top of this file): with statistics from before a
-- burst, the planner could walk the table by seq for them instead, through the published rows (to
-- the end of the table for a key with no next message), a cost that grows with the table.
WITH done AS (
    {{mark_rows}}
    RETURNING key, seq
), nexts AS MATERIALIZED (
    SELECT k.key, n.seq
    FROM (SELECT key, max(seq) AS last FROM done WHERE key IS NOT NULL GROUP BY key) AS k
    CROSS JOIN LATERAL (
        SELECT n.seq, n.state, n.held FROM outbox_message AS n
        WHERE n.key >= k.key AND n.key <= k.key AND n.seq > k.last AND n.state IN ({{blocking}})
        ORDER BY n.key, n.seq LIMIT 1
    ) AS n
    WHERE n.state = 'pending' AND n.held
), unparked AS (
    UPDATE outbox_message AS u SET held = false
    FROM nexts
    WHERE u.seq = nexts.seq AND u.state = 'pending' AND u.held AND coalesce((
        SELECT e.seq FROM outbox_message AS e
        WHERE e.key >= nexts.key AND e.key <= nexts.key AND e.state IN ({{blocking}})
          AND NOT (e.seq = ANY(CAST(:seqs AS bigint[])))
        ORDER BY e.key, e.seq LIMIT 1
    ), nexts.seq) >= nexts.seq
    RETURNING 1
)
SELECT count(*) FROM done

-- extend_leases --
-- A relay still working on its rows pushes their expiry back; one whose lease was taken over
-- extends nothing (the state and token no longer match).
UPDATE outbox_message
SET lease_expires_at = {{lease_ends}}
WHERE lease_token = ANY(CAST(:tokens AS uuid[])) AND state = 'in_flight'

-- settle_failures --
-- Failed attempts, settled in one statement: each row goes back to pending (with its next
-- attempt time) or to dead, lease-guarded like mark_published (settling a row ends its
-- suspicion), and an attempt record is written
-- for exactly the rows that changed. :unburns is 1 for failures that must not count against
-- max_attempts (the claim counted the attempt already). One array per column, unnested together.
WITH d AS (
    SELECT * FROM unnest(
        CAST(:seqs AS bigint[]), CAST(:states AS text[]), CAST(:available_ats AS timestamptz[]),
        CAST(:unburns AS int[]), CAST(:classes AS text[]), CAST(:outcomes AS text[]),
        CAST(:errors AS text[])
    ) AS d(seq, state, available_at, unburn, failure_class, outcome, error)
), settled AS (
    UPDATE outbox_message AS m
    SET state = d.state,
        available_at = coalesce(d.available_at, m.available_at),
        attempts = m.attempts - d.unburn,
        last_error = d.error,
        last_failed_at = coalesce(:now, now()), suspect = NULL,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM d
    WHERE m.seq = d.seq AND m.lease_token = :token AND m.state = 'in_flight'
    RETURNING m.id, m.attempts + d.unburn AS attempt, d.failure_class, d.outcome, d.error,
              d.available_at
)
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
SELECT id, attempt, coalesce(:now, now()), :relay_id, failure_class, outcome, error, available_at
FROM settled

-- ------------------------------------------------------------------------ logical capture

-- admit_logged --
-- Messages read from the log (relay/capture/source.py) that take the table's path: a failure
-- settled as the table settles one (pending with its next attempt time, or dead), a message held
-- back behind its key's, a delayed one. Written in the log's order (one array per column, unnested
-- with their ordinality), so their seqs, and the key order the claims keep, follow it. A message
-- that has a row already (:has_rows; an idempotency key or a delay gave it one at enqueue, held
-- at available_at 9999-12-31, outbox.logged.HELD_UNTIL, until the log's copy is read) moves: its
-- held row goes, and is written again here, behind what came before it in the log; one whose
-- held row is gone (an operator cancelled it) is not written. Each failure gets its attempt
-- record, as settle_failures writes.
WITH d AS (
    SELECT * FROM unnest(
        CAST(:ids AS uuid[]), CAST(:has_rows AS boolean[]), CAST(:exchanges AS text[]),
        CAST(:routing_keys AS text[]), CAST(:payloads AS bytea[]), CAST(:content_types AS text[]),
        CAST(CAST(:headers AS text[]) AS json[]), CAST(:keys AS text[]), CAST(:priorities AS int[]),
        CAST(:max_attempts AS int[]), CAST(:states AS text[]), CAST(:attempts AS int[]),
        CAST(:available_ats AS timestamptz[]), CAST(:created_ats AS timestamptz[]),
        CAST(:traceparents AS text[]), CAST(:tracestates AS text[]), CAST(:errors AS text[]),
        CAST(:classes AS text[]), CAST(:outcomes AS text[])
    ) WITH ORDINALITY AS d(id, has_row, exchange, routing_key, payload, content_type, headers, key,
                           priority, max_attempts, state, attempts, available_at, created_at,
                           traceparent, tracestate, error, failure_class, outcome, n)
), held AS (
    DELETE FROM outbox_message AS m USING d
    WHERE d.has_row AND m.id = d.id AND m.state = 'pending' AND m.available_at = '9999-12-31 00:00:00+00'
    RETURNING m.id, m.idempotency_key
), admitted AS (
    INSERT INTO outbox_message
        (id, exchange, routing_key, payload, content_type, headers, key, idempotency_key,
         priority, max_attempts, state, attempts, available_at, created_at, last_error,
         last_failed_at, traceparent, tracestate)
    SELECT d.id, d.exchange, d.routing_key, d.payload, d.content_type, d.headers, d.key,
           held.idempotency_key, d.priority, d.max_attempts, d.state, d.attempts,
           d.available_at, d.created_at, d.error,
           CASE WHEN d.failure_class IS NOT NULL THEN coalesce(:now, now()) END,
           d.traceparent, d.tracestate
    FROM d LEFT JOIN held ON held.id = d.id
    WHERE NOT d.has_row OR held.id IS NOT NULL
    ORDER BY d.n
    RETURNING id
)
INSERT INTO outbox_attempt
    (message_id, attempt, at, relay_id, failure_class, outcome, error, next_attempt_at)
SELECT d.id, d.attempts, coalesce(:now, now()), :relay_id, d.failure_class, d.outcome, d.error,
       CASE WHEN d.state = 'pending' THEN d.available_at END
FROM d JOIN admitted ON admitted.id = d.id
WHERE d.failure_class IS NOT NULL

-- mark_logged --
-- The held rows of messages the log's copy of which the broker confirmed (an idempotency key gave
-- them a row, held at available_at HELD_UNTIL): published, as mark_published would mark them. One
-- an operator cancelled meanwhile stays cancelled.
UPDATE outbox_message
SET state = 'published', published_at = coalesce(:now, now()), available_at = created_at,
    attempts = attempts + 1
WHERE id = ANY(CAST(:ids AS uuid[])) AND state = 'pending' AND available_at = '9999-12-31 00:00:00+00'

-- held_keys --
-- Which of :keys the table holds: a key with a message there in a blocking state keeps the log's
-- later messages of the key behind it, in the table. Rows held for the log (at HELD_UNTIL) are the
-- log's own, read in their turn, and hold nothing. One probe of outbox_message_key_idx per key.
SELECT DISTINCT m.key FROM unnest(CAST(:keys AS text[])) AS k(key)
CROSS JOIN LATERAL (
    SELECT e.key FROM outbox_message AS e
    WHERE e.key >= k.key AND e.key <= k.key AND e.state IN ({{blocking}})
      AND e.available_at <> '9999-12-31 00:00:00+00'
    ORDER BY e.key, e.seq LIMIT 1
) AS m

-- ------------------------------------------------------------------------ resources, relays

-- ensure_resource --
-- A resource's row, made the first time a relay changes it (common.sql, resource_columns).
INSERT INTO outbox_resource (resource) VALUES (:resource) ON CONFLICT DO NOTHING

-- lock_resource --
-- The resource row under a row lock (inside Dialect.transaction), with the time its transition
-- is computed at: the database's, read in the same statement.
SELECT {{resource_columns}}, coalesce(:now, now()) AS now
FROM outbox_resource WHERE resource = :resource FOR UPDATE

-- register_relay --
-- A relay's run begins (common.sql, beat): its row, new or taking over an earlier run's under the
-- same id, names this run by started_at.
INSERT INTO outbox_relay (relay_id, started_at, last_seen)
VALUES (:relay_id, coalesce(:now, now()), coalesce(:now, now()))
ON CONFLICT (relay_id) DO UPDATE SET started_at = excluded.started_at,
                                     last_seen = excluded.last_seen
RETURNING started_at

-- heartbeat --
-- Relay heartbeats (outbox_relay): each running relay refreshes its row every few seconds.
INSERT INTO outbox_relay (relay_id, started_at, last_seen)
VALUES (:relay_id, coalesce(:now, now()), coalesce(:now, now()))
ON CONFLICT (relay_id) DO UPDATE SET last_seen = excluded.last_seen

-- relays --
SELECT relay_id, started_at, last_seen FROM outbox_relay
WHERE last_seen > coalesce(:now, now()) - make_interval(secs => :within) ORDER BY relay_id

-- ------------------------------------------------------------------------ status and gauges

-- pending_summary --
-- Pending rows due now and later, and how long the longest-waiting due one has been due: a sum
-- over the partial indexes that hold the pending rows between them (common.sql, pending_unkeyed),
-- so it reads the backlog and never a published row.
SELECT coalesce(sum(due), 0), coalesce(sum(later), 0),
       EXTRACT(EPOCH FROM coalesce(:now, now()) - min(oldest))
FROM (
    SELECT count(*) FILTER (WHERE m.available_at <= coalesce(:now, now())) AS due,
           count(*) FILTER (WHERE m.available_at > coalesce(:now, now())) AS later,
           min(m.available_at) FILTER (WHERE m.available_at <= coalesce(:now, now())) AS oldest
    FROM outbox_message AS m WHERE {{pending_unkeyed}}
    UNION ALL
    SELECT count(*) FILTER (WHERE m.available_at <= coalesce(:now, now())) AS due,
           count(*) FILTER (WHERE m.available_at > coalesce(:now, now())) AS later,
           min(m.available_at) FILTER (WHERE m.available_at <= coalesce(:now, now())) AS oldest
    FROM outbox_message AS m WHERE {{pending_keyed}}
    UNION ALL
    SELECT count(*) FILTER (WHERE m.available_at <= coalesce(:now, now())) AS due,
           count(*) FILTER (WHERE m.available_at > coalesce(:now, now())) AS later,
           min(m.available_at) FILTER (WHERE m.available_at <= coalesce(:now, now())) AS oldest
    FROM outbox_message AS m WHERE {{pending_parked}}
) AS p

-- table_size --
-- What PostgreSQL knows of outbox_message without reading it, for estimating its published and
-- cancelled rows (relay/store/estimates.py): the heap's size now, the statistics system's running
-- count of live rows and whether a VACUUM or ANALYZE has set it since the statistics began, and
-- the planner's figures. Catalog reads and the statistics system's memory, at any table size. The
-- table is found through the search_path, as every other statement finds it; no row when it does
-- not exist.
SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages,
       pg_stat_get_live_tuples(c.oid) AS live_tuples,
       coalesce(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid),
                pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid))
           IS NOT NULL AS measured,
       c.reltuples, c.relpages
FROM pg_class AS c
WHERE c.oid = to_regclass('outbox_message')

-- table_health --
-- The relay's tables, found through the search_path as every other statement finds them: the
-- server's autovacuum setting, each table's storage options (`autovacuum_enabled=false` among them
-- turns autovacuum off for that table alone), and the statistics system's running counts of its
-- live and dead rows (pg_stat_user_tables' n_live_tup and n_dead_tup). Catalog reads and the
-- statistics system's memory: cheap at any table size, so every metrics scrape may run it. No row
-- for a table that does not exist.
SELECT t.name, current_setting('autovacuum') AS server, c.reloptions,
       pg_stat_get_live_tuples(c.oid) AS live, pg_stat_get_dead_tuples(c.oid) AS dead
FROM (VALUES (1, 'outbox_message'), (2, 'outbox_attempt'), (3, 'outbox_relay'),
             (4, 'outbox_resource')) AS t(n, name)
JOIN pg_class AS c ON c.oid = to_regclass(t.name)
ORDER BY t.n

-- table_shares --
-- ANALYZE's most common states and exchanges with their shares of the rows, read only beside a
-- large table (where they are used). The table's name is a constant and its schema a value, so
-- the planner goes to its catalog rows by index; joined to the table's name instead, pg_stats
-- reads the column names of every table in the database.
SELECT attname, most_common_vals::text::text[] AS vals, most_common_freqs AS freqs
FROM pg_stats
WHERE tablename = 'outbox_message' AND attname IN ('state', 'exchange')
  AND schemaname = (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n
                    ON n.oid = c.relnamespace WHERE c.oid = to_regclass('outbox_message'))

-- no_parallel --
-- Counting reads a few rows through the partial indexes, but the planner, guessing a share of a
-- large table for each state it has no statistics of, may plan parallel workers, whose start
-- costs more than the whole count. Off for the counting transaction only (set_config's is_local).
SELECT set_config('max_parallel_workers_per_gather', '0', true)

-- read_snapshot --
BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- ------------------------------------------------------------------------ the console's charts

-- published_minute --
-- date_trunc keeps the time zone: each row is one minute's instant (common.sql,
-- published_per_minute).
date_trunc('minute', published_at)

-- failed_minute --
date_trunc('minute', at)

-- ------------------------------------------------------------------------ retention

-- eligible_states --
-- common.sql, eligible: :states is a text[].
state = ANY(CAST(:states AS text[]))

-- failed_at --
-- greatest() ignores NULLs (a message that never failed, or was never replayed).
greatest(created_at, last_failed_at, replayed_at)

-- purge_batch --
-- See relay/store/retention.py. One batch, one statement, one short transaction (autocommit).
-- SKIP LOCKED: a row an operator is replaying right now, or that another purge (a CLI run beside
-- the relays' own retention) has taken, is passed over instead of waited for, and concurrent
-- purges take disjoint batches. The lock is taken after the state and time checks, and PostgreSQL
-- re-checks them on a row changed since the snapshot, so a row replayed to pending just before is
-- not deleted. The message's attempt rows go in the same statement. `= ANY(ARRAY(...))` rather
-- than a join: the planner cannot pick a hash join that reads the whole table (or all attempts)
-- for a few hundred rows; these are probes of the primary key and of outbox_attempt_message_idx.
-- Returns how many messages went and the highest id among them (the next batch's :after_id); uuid
-- has no max() aggregate, hence the ORDER BY.
WITH doomed AS (
    SELECT seq FROM outbox_message
    WHERE {{eligible}}
    ORDER BY id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox_message
    WHERE seq = ANY(ARRAY(SELECT seq FROM doomed))
    RETURNING id
), attempts AS (
    DELETE FROM outbox_attempt
    WHERE message_id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT (SELECT count(*) FROM gone),
       (SELECT id FROM gone ORDER BY id DESC LIMIT 1)

-- ------------------------------------------------------------------------ poolers

-- backend --
-- The server process running this connection's statements, and the statement timeout that
-- server connection has. A pooler (PgBouncer, ...) answers the client's startup itself with a
-- BackendKeyData of its own (cancel requests go to it), so the pid the client was given is not
-- the server's; on a direct connection the two are the same.
SELECT pg_backend_pid(), current_setting('statement_timeout')

-- ------------------------------------------------------------------------ migrations

-- role_and_schema --
-- Who a migration that was refused a privilege ran as, the schema it would create the tables in
-- (NULL: none on its search_path exists or is usable) and the database: the words of the error
-- the operator is given (Postgres.migration_denied).
SELECT current_user, current_schema(), current_database()

-- read_only --
-- A standby in recovery, or a server whose sessions are read-only (default_transaction_read_only):
-- nothing the relay writes would be taken. Both are read from memory, no table is touched.
pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'
