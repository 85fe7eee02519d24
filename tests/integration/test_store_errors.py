"""The store's one error boundary: whatever the path (a claim, a retention pass, an operator
command), a database that is down is DatabaseUnavailable and one that was never migrated is
SchemaNotFound, on PostgreSQL and SQLite."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import text

import outbox
from outbox.schema import SCHEMA_VERSION
from relay.core.retention import RetentionPolicy
from relay.errors import DatabaseUnavailable, SchemaNotFound
from relay.store import command_engine
from relay.store.sql_store import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

UNREACHABLE_PG = "postgresql+psycopg://root:secret@127.0.0.1:1/x"


def unreachable_sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}"


@pytest.fixture(params=["postgresql", "sqlite"])
def unreachable(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return UNREACHABLE_PG if request.param == "postgresql" else unreachable_sqlite(tmp_path)


def test_a_database_that_is_down_is_unavailable_on_every_path(unreachable: str) -> None:
    store = open_store(unreachable, check=False)
    try:
        with pytest.raises(DatabaseUnavailable) as down:
            store.counts()
        assert "secret" not in str(down.value)
        with pytest.raises(DatabaseUnavailable):
            store.purge_expired(RetentionPolicy(), dt.datetime.now(dt.UTC))
        with pytest.raises(DatabaseUnavailable):
            store.schema_version()
    finally:
        store.close()
    with (
        pytest.raises(DatabaseUnavailable),
        command_engine(unreachable) as engine,
        engine.connect() as conn,
    ):
        conn.execute(text("SELECT 1"))


def test_a_password_in_the_urls_query_is_masked_too() -> None:
    # libpq takes ?password= as well as the userinfo's; neither may reach a log line.
    store = open_store("postgresql+psycopg://root@127.0.0.1:1/x?password=hunter22", check=False)
    try:
        with pytest.raises(DatabaseUnavailable) as down:
            store.counts()
    finally:
        store.close()
    assert "hunter22" not in str(down.value)
    assert "password=***" in str(down.value)


def test_a_database_never_migrated_says_so(db_url: str) -> None:
    store = open_store(db_url)
    try:
        assert store.schema_version() == 0
        with pytest.raises(SchemaNotFound, match="outbox-relay migrate"):
            store.counts()
        with pytest.raises(SchemaNotFound):
            store.purge_expired(RetentionPolicy(), dt.datetime.now(dt.UTC))
        with command_engine(db_url) as engine:
            outbox.create_schema(engine)
        assert store.schema_version() == SCHEMA_VERSION
        assert store.counts().ready == 0
    finally:
        store.close()
