"""`outbox-relay migrate --check` and `migrate` as an operator runs them (the two commands of
docs/guides/alembic.md, read from the page): the check lists what is missing or different and
changes nothing (exit 1), or says the schema is up to date (exit 0); migrate completes the
schema, once; a relay refuses an incomplete schema in one line naming what is missing and what
to run."""

from __future__ import annotations

import datetime as dt
import logging
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, insert, inspect, text

import outbox
from outbox.databases import AUTOVACUUM_SETTINGS
from outbox.migrate import inspect_schema
from outbox.schema import SCHEMA_VERSION, schema_version
from relay.runtime.runner import check_schema
from relay.store.sql_store import open_store
from tests.docs_blocks import block
from tests.support.cli import UNREACHABLE_AMQP, assert_one_line_error, cli, environment, in_process
from tests.support.db import make_app_engine

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

NOW = dt.datetime.now(dt.UTC)


def documented_commands() -> dict[str, list[str]]:
    """The page's `migrate-check` block: each command's argv (without its comment), by its last
    word ("--check" or "migrate")."""
    code = block("guides/alembic.md", "migrate-check")
    commands = [shlex.split(line, comments=True) for line in code.splitlines()]
    assert all(argv[0] == "outbox-relay" for argv in commands)
    return {argv[-1]: argv[1:] for argv in commands}


def run_documented(command: str, db_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command of the page as written, the database given as its variable (OUTBOX_DB_URL)."""
    return cli(*documented_commands()[command], cwd=cwd, env=environment(OUTBOX_DB_URL=db_url))


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    """PostgreSQL, then SQLite: this file's databases (conftest's `db_url` may name more)."""
    return str(request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url"))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_app_engine(db_url)
    yield engine
    engine.dispose()


def forget_versions(engine: Engine) -> None:
    """As a schema made by an Alembic migration: the tables, and no version recorded."""
    with engine.begin() as conn:
        conn.execute(delete(schema_version))


def test_the_documented_commands_check_then_complete_an_older_schema(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_app_engine(pg_url)
    try:
        outbox.create_schema(engine)
        with engine.begin() as conn:  # version 5's inbox index, and no autovacuum on attempts
            conn.exec_driver_sql("DROP INDEX outbox_inbox_consumer_processed_idx")
            conn.exec_driver_sql(
                "CREATE INDEX outbox_inbox_processed_idx ON outbox_inbox (processed_at)"
            )
            conn.exec_driver_sql("ALTER TABLE outbox_message DROP COLUMN suspect")  # version 7's
            conn.execute(delete(schema_version).where(schema_version.c.version >= 6))
            params = ", ".join(AUTOVACUUM_SETTINGS["outbox_attempt"])
            conn.exec_driver_sql(f"ALTER TABLE outbox_attempt RESET ({params})")
        with engine.connect() as conn:
            before = inspect_schema(conn)

        checked = run_documented("--check", pg_url, tmp_path)
        assert checked.returncode == 1, checked.stderr
        assert checked.stdout.splitlines() == [
            "missing index outbox_inbox_consumer_processed_idx on outbox_inbox",
            "missing column suspect in outbox_message",
            "obsolete index outbox_inbox_processed_idx on outbox_inbox",
            "missing autovacuum settings on outbox_attempt: autovacuum_vacuum_scale_factor = 0.05, "
            "autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.05",
        ]
        (summary,) = checked.stderr.splitlines()
        assert f"(version 5) differs from version {SCHEMA_VERSION} in 4 way(s)" in summary
        assert summary.endswith(
            "nothing was changed: run `outbox-relay migrate` to bring it up to date"
        )
        with engine.connect() as conn:
            assert inspect_schema(conn) == before

        migrated = run_documented("migrate", pg_url, tmp_path)
        assert migrated.returncode == 0, migrated.stderr
        (logged,) = migrated.stderr.splitlines()
        assert f" schema.migrated version={SCHEMA_VERSION} previous_version=5 fixed=" in logged
        assert all(str(gap) in logged for gap in before.gaps)

        # In process from here: the subprocess path is the one above.
        assert in_process("--db", pg_url, "migrate", "--check") == (
            0, f"outbox schema is up to date (version {SCHEMA_VERSION}, recorded)\n", ""
        )  # fmt: skip
        assert in_process("--db", pg_url, "migrate")[0] == 0  # again: nothing to do
        with engine.connect() as conn:
            assert inspect_schema(conn).complete
            versions = conn.execute(text("SELECT version FROM outbox_schema_version")).scalars()
            assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1))
    finally:
        engine.dispose()


def test_check_on_a_database_never_migrated_lists_every_table_and_creates_none(
    sqlite_url: str, tmp_path: Path
) -> None:
    result = cli("--db", sqlite_url, "migrate", "--check", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        f"missing table {table}" for table in outbox.metadata.tables
    )
    assert len(result.stderr.splitlines()) == 1
    assert "(no recorded version)" in result.stderr
    engine = make_app_engine(sqlite_url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_a_complete_schema_without_a_version_is_up_to_date_and_migrate_records_it(
    engine: Engine, db_url: str
) -> None:
    outbox.create_schema(engine)
    forget_versions(engine)

    assert in_process("--db", db_url, "migrate", "--check") == (
        0,
        f"outbox schema is up to date (version {SCHEMA_VERSION}, not recorded: "
        "`outbox-relay migrate` would record it, changing nothing else)\n",
        "",
    )
    assert in_process("--db", db_url, "migrate")[0] == 0
    with engine.connect() as conn:
        versions = conn.execute(text("SELECT version FROM outbox_schema_version")).scalars().all()
    assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1))


def test_migrate_refuses_a_table_it_cannot_complete_in_one_line(sqlite_url: str) -> None:
    engine = make_app_engine(sqlite_url)
    try:
        outbox.create_schema(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE outbox_message DROP COLUMN exchange")
    finally:
        engine.dispose()

    assert in_process("--db", sqlite_url, "migrate", "--check")[:2] == (
        1, "missing column exchange in outbox_message\n"
    )  # fmt: skip
    assert in_process("--db", sqlite_url, "migrate") == (
        1,
        "",
        "outbox-relay: migrate failed: outbox_message lacks column exchange, which is NOT NULL "
        "without a default, so it cannot be added: outbox_message was not made from "
        "outbox.metadata\n",
    )


def test_run_refuses_an_incomplete_schema_naming_what_is_missing(
    sqlite_url: str, tmp_path: Path
) -> None:
    engine = make_app_engine(sqlite_url)
    try:
        outbox.create_schema(engine)
        forget_versions(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE outbox_relay")
            conn.exec_driver_sql("DROP INDEX outbox_message_ready_idx")
    finally:
        engine.dispose()

    # The schema is checked before the broker is needed: the message is about the schema.
    result = cli("--db", sqlite_url, "--amqp", UNREACHABLE_AMQP, "run", cwd=tmp_path)
    line = assert_one_line_error(result, 1)
    assert line == (
        "outbox-relay: run failed: the outbox schema (no recorded version) lacks what this relay "
        f"(version {SCHEMA_VERSION}) needs: missing table outbox_relay; missing index "
        "outbox_message_ready_idx on outbox_message: run `outbox-relay migrate`, or an Alembic "
        "migration autogenerated from outbox.metadata"
    )


def test_a_schema_a_newer_outbox_migrated_is_left_alone(
    engine: Engine,
    db_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older release's `migrate` (a rollback's deploy step) on a newer schema says so in one
    line, exits 0 and changes nothing; that release's relay runs on the schema."""
    outbox.create_schema(engine)
    with engine.begin() as conn:  # version 7 retired an index this version still wants
        conn.execute(insert(schema_version).values(version=SCHEMA_VERSION + 1, applied_at=NOW))
        conn.exec_driver_sql("DROP INDEX outbox_message_failed_idx")

    assert in_process("--db", db_url, "migrate", "--check") == (
        0,
        f"outbox schema is version {SCHEMA_VERSION + 1}, newer than this outbox-relay's "
        f"{SCHEMA_VERSION}: nothing to do\n",
        "",
    )
    migrated = cli("--db", db_url, "migrate", cwd=tmp_path)
    assert (migrated.returncode, migrated.stdout, migrated.stderr) == (
        0,
        f"outbox-relay migrate: the outbox schema is at version {SCHEMA_VERSION + 1}, newer "
        f"than this outbox-relay's {SCHEMA_VERSION}; nothing to do\n",
        "",
    )
    with engine.connect() as conn:
        assert "outbox_message_failed_idx" not in {
            ix["name"] for ix in inspect(conn).get_indexes("outbox_message")
        }
        versions = conn.execute(text("SELECT version FROM outbox_schema_version")).scalars()
        assert sorted(versions) == list(range(1, SCHEMA_VERSION + 2))

    store = open_store(db_url)
    try:
        with caplog.at_level(logging.WARNING, logger="relay"):
            check_schema(store)  # the recorded version is trusted: no refusal, no warning
    finally:
        store.close()
    assert caplog.records == []
