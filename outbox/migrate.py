"""Creating and upgrading the outbox schema, whatever made it.

`upgrade` compares the database with `outbox.metadata` (outbox/shape.py) and closes every gap:
it creates missing tables, indexes and unique constraints, adds missing columns, sets missing
autovacuum settings, rebuilds an index whose definition changed, drops an index a later version
replaced, and records the version. So one path upgrades a schema `migrate` made, completes one
an Alembic migration made from `outbox.metadata` (which records no version), and changes nothing
on a complete one. A column added to rows already there that needs values of their own gets a
backfill (BACKFILLS), run right after the column is added, in the same transaction; a future change
that adding cannot express at all (a type change) gets a step of its own here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from sqlalchemy import (
    Connection,
    Engine,
    Index,
    Table,
    Update,
    case,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.schema import CreateColumn, DropIndex

from outbox import schema
from outbox.databases import alter_storage, database_named, database_of
from outbox.errors import SchemaConflict
from outbox.schema import message
from outbox.shape import Kind, Shape, structural_gaps
from outbox.states import STAMP_ALONE, STAMP_GROUPED, STAMP_SOLITARY, State, Suspect

__all__ = ["SchemaConflict", "apply_storage_settings", "inspect_schema", "upgrade"]


def storage_settings_sql(dialect: str) -> tuple[str, ...]:
    """The statements that set the autovacuum settings `migrate` gives the outbox tables on
    `dialect` ("postgresql", ...): none on a database without them. For a migration of your own
    (outbox.alembic.apply_storage_settings)."""
    database = database_named(dialect)
    return () if database is None else database.storage_settings


def apply_storage_settings(conn: Connection) -> None:
    """Set every one of the autovacuum settings on the outbox tables (PostgreSQL; nothing on
    other databases), over any value already there. Runs in the caller's transaction, never
    commits."""
    for statement in storage_settings_sql(conn.dialect.name):
        conn.exec_driver_sql(statement)


def suspect_marks() -> tuple[Update, ...]:
    """The UPDATEs that give outbox_message.suspect its value on rows that relays of schema 6
    marked in their own way (outbox.states' STAMP_* texts, and a pending row's lease_expires_at):
    the suspects waiting to be claimed, those in flight, and those that died of crashes (which a
    replay makes suspects again). One per state, so each reads through that state's index."""
    m = message.c
    alone = m.last_error.in_([STAMP_SOLITARY, STAMP_ALONE])
    which = case((alone, Suspect.ALONE.value), else_=Suspect.GROUP.value)
    marked = m.suspect.is_(None)
    return (
        update(message)
        .where(m.state == State.PENDING.value, m.lease_expires_at.isnot(None), marked)
        .values(suspect=which),
        update(message)
        .where(m.state == State.IN_FLIGHT.value, m.last_error.in_([STAMP_ALONE, STAMP_GROUPED]))
        .where(marked)
        .values(suspect=which),
        update(message)
        .where(m.state == State.DEAD.value, m.lease_expires_at.isnot(None), marked)
        .values(suspect=Suspect.GROUP.value),
    )


def _mark_suspects(conn: Connection) -> None:
    for statement in suspect_marks():
        conn.execute(statement)


# What the rows already there get when a column is added (see the module's docstring).
BACKFILLS: dict[tuple[str, str], Callable[[Connection], None]] = {
    (message.name, "suspect"): _mark_suspects,
}


def current_version(conn: Connection) -> int:
    """The highest version `migrate` recorded; 0 when none (never migrated, or made otherwise)."""
    if not inspect(conn).has_table(schema.schema_version.name):
        return 0
    found = conn.execute(select(func.max(schema.schema_version.c.version))).scalar()
    return int(found or 0)


def inspect_schema(conn: Connection) -> Shape:
    """The outbox schema on `conn` against what this version needs; changes nothing."""
    database = database_of(conn.dialect.name)
    tables, gaps = structural_gaps(conn)
    gaps.extend(database.storage_gaps(conn, tables))
    gaps.extend(database.index_gaps(conn, tables))
    return Shape(current_version(conn), tables, tuple(gaps))


def complete(conn: Connection, shape: Shape) -> None:
    """Close every gap of `shape` (in its order: tables first) in the caller's transaction.

    Building an index locks its table against writes (not reads) for as long as the build
    takes: on a large live table, prefer a quiet moment.
    """
    database = database_of(conn.dialect.name)
    for gap in shape.gaps:
        table = schema.metadata.tables[gap.table]
        if gap.kind is Kind.TABLE:
            table.create(conn)
            database.created(conn, gap.table)
        elif gap.kind is Kind.COLUMNS:
            for name in gap.names:
                _add_column(conn, table, name)
                backfill = BACKFILLS.get((gap.table, name))
                if backfill is not None:
                    backfill(conn)
        elif gap.kind is Kind.UNIQUE:
            database.add_unique(conn, table, gap.names)
        elif gap.kind is Kind.INDEX and gap.names[0] in database.own_indexes:
            conn.exec_driver_sql(database.own_indexes[gap.names[0]])
        elif gap.kind is Kind.INDEX:
            _index(table, gap.names[0]).create(conn)
        elif gap.kind is Kind.INDEX_DIFFERS:
            index = _index(table, gap.names[0])
            conn.execute(DropIndex(index))
            index.create(conn)
        elif gap.kind is Kind.OBSOLETE_INDEX:
            retired = next(ix for ix in schema.OBSOLETE_INDEXES if ix.name == gap.names[0])
            conn.execute(DropIndex(retired, if_exists=True))
        elif gap.kind is Kind.STORAGE:
            conn.exec_driver_sql(alter_storage(gap.table, list(gap.names)))


def _index(table: Table, name: str) -> Index:
    return next(index for index in table.indexes if index.name == name)


def _add_column(conn: Connection, table: Table, name: str) -> None:
    column = table.c[name]
    if not column.nullable and column.server_default is None:
        # No value to give the rows already there; this was never an outbox table's shape.
        raise SchemaConflict(
            f"{table.name} lacks column {name}, which is NOT NULL without a default, so it "
            f"cannot be added: {table.name} was not made from outbox.metadata"
        )
    spec = CreateColumn(column).compile(dialect=conn.dialect)
    conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {spec}")


def upgrade(bind: Engine | Connection) -> int:
    """Bring the outbox schema to this version (create, upgrade or complete it); return the
    version now recorded. Safe to repeat and to race (PostgreSQL and MySQL serialise migrations).
    UnsupportedDatabase, before any SQL, on a database the outbox does not run on."""
    database = database_of(bind.dialect.name)
    if isinstance(bind, Engine):
        with bind.begin() as conn, database.migration_lock(conn):
            return _apply(conn)
    with database.migration_lock(bind):
        return _apply(bind)


def _apply(conn: Connection) -> int:
    version = current_version(conn)
    if version > schema.SCHEMA_VERSION:
        # A newer outbox migrated this database; what this one calls obsolete or different may
        # be what that one needs.
        return version
    complete(conn, inspect_schema(conn))
    # One row per version the schema now has, as when each version was its own step.
    now = dt.datetime.now(dt.UTC)
    record = database_of(conn.dialect.name).record_versions()
    for number in range(version + 1, schema.SCHEMA_VERSION + 1):
        conn.execute(record.values(version=number, applied_at=now))
    return schema.SCHEMA_VERSION
