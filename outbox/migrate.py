"""Schema upgrades: each version is one function; the applied version is recorded in a table."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from sqlalchemy import Connection, Engine, func, insert, inspect, select

from outbox import schema

Migration = Callable[[Connection], None]


def _v1(conn: Connection) -> None:
    schema.message.create(conn, checkfirst=True)
    schema.attempt.create(conn, checkfirst=True)


# Autovacuum per table. Storage parameters cannot be bound, so the ALTER statements below are
# rendered from these constants (never from input).
#
# outbox_message is a queue: every message leaves ~2 dead tuples (the claim's UPDATE, the
# settlement's UPDATE) and then one more when retention deletes it. At the default scale factor
# (0.2) a 10M-row table collects 2M dead tuples before autovacuum looks at it; at 0.01 plus 1000
# it is vacuumed every ~1% of churn, which keeps the partial claim indexes small and the heap from
# growing (PgQueuer uses the same scale factor). Analyze at 2% keeps the planner's idea of how
# many rows are pending current, and a cost delay of 1 ms lets each vacuum finish quickly.
#
# No fillfactor: free space left on a page pays off through HOT updates, and no update of this
# table can be HOT, since each one changes a column that an index covers or that an index
# predicate names (state, held, lease_expires_at). The reserved space would only make every kept
# row cost more pages.
#
# outbox_attempt is append-only: rows are inserted (failures, operator actions) and only ever
# deleted by retention, in bulk, never updated. Its dead tuples come from retention alone, so
# 5% (plus 1000) is enough to reclaim them soon after a purge without vacuuming it needlessly;
# inserts alone trigger vacuum through the default autovacuum_vacuum_insert_scale_factor, which is
# fine for it. fillfactor stays 100 (no updates). Cost delay is left at the server default: it is
# not on the relay's claim path.
#
# TOAST tables (large payloads) inherit these values when no toast.* parameter is set.
AUTOVACUUM_SETTINGS: dict[str, dict[str, float]] = {
    "outbox_message": {
        "autovacuum_vacuum_scale_factor": 0.01,
        "autovacuum_vacuum_threshold": 1000,
        "autovacuum_analyze_scale_factor": 0.02,
        "autovacuum_vacuum_cost_delay": 1,
    },
    "outbox_attempt": {
        "autovacuum_vacuum_scale_factor": 0.05,
        "autovacuum_vacuum_threshold": 1000,
        "autovacuum_analyze_scale_factor": 0.05,
    },
}

# SET (storage parameters) takes a SHARE UPDATE EXCLUSIVE lock: reads and writes go on; only
# another schema change or a VACUUM conflicts (autovacuum yields to it). Idempotent.
STORAGE_SETTINGS_SQL: tuple[str, ...] = tuple(
    f"ALTER TABLE {table} SET ({', '.join(f'{name} = {value}' for name, value in params.items())})"
    for table, params in AUTOVACUUM_SETTINGS.items()
)


def apply_storage_settings(conn: Connection) -> None:
    """Set AUTOVACUUM_SETTINGS on the outbox tables (PostgreSQL; nothing on other databases).

    Meant for a migration: runs in the caller's transaction and never commits.
    """
    if conn.dialect.name != "postgresql":
        return
    for statement in STORAGE_SETTINGS_SQL:
        conn.exec_driver_sql(statement)


def _v2(conn: Connection) -> None:
    apply_storage_settings(conn)


def _v3(conn: Connection) -> None:
    schema.resource.create(conn, checkfirst=True)


def _v4(conn: Connection) -> None:
    schema.inbox.create(conn, checkfirst=True)


def _v5(conn: Connection) -> None:
    schema.relay_instance.create(conn, checkfirst=True)


def _v6(conn: Connection) -> None:
    # Inbox retention became per consumer: (consumer, processed_at) replaces (processed_at),
    # which a per-consumer purge could only walk past other consumers' rows. Building it locks
    # the inbox against writes (consumers wait) for as long as the build takes.
    for index in schema.inbox.indexes:
        index.create(conn, checkfirst=True)
    conn.exec_driver_sql("DROP INDEX IF EXISTS outbox_inbox_processed_idx")


MIGRATIONS: dict[int, Migration] = {1: _v1, 2: _v2, 3: _v3, 4: _v4, 5: _v5, 6: _v6}


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table(schema.schema_version.name):
        return 0
    found = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
    return int(found or 0)


def upgrade(bind: Engine | Connection) -> int:
    """Apply every migration newer than the recorded version; return the version now in place."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            return _upgrade(conn)
    return _upgrade(bind)


def _upgrade(conn: Connection) -> int:
    if conn.dialect.name == "postgresql":
        # Two deploys migrating at once must not both create the same table.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('outbox_relay.migrate'))")
    schema.schema_version.create(conn, checkfirst=True)
    version = current_version(conn)
    for number in sorted(MIGRATIONS):
        if number > version:
            MIGRATIONS[number](conn)
            conn.execute(
                insert(schema.schema_version).values(
                    version=number, applied_at=dt.datetime.now(dt.UTC)
                )
            )
            version = number
    return version
