"""Schema version 6: the inbox's retention index becomes (consumer, processed_at), for purges that
keep to one consumer's rows. A database at version 5 upgrades in place, keeping its rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, delete, func, insert, inspect, select
from sqlalchemy.schema import DropIndex

import outbox
from outbox.migrate import current_version
from outbox.schema import SCHEMA_VERSION, inbox, schema_version
from tests.support.db import make_app_engine


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_app_engine(db_url)
    yield engine
    engine.dispose()


def inbox_indexes(engine: Engine) -> dict[str, list[str | None]]:
    with engine.connect() as conn:
        found = inspect(conn).get_indexes("outbox_inbox")
    return {str(index["name"]): list(index["column_names"]) for index in found}


def as_version_5(engine: Engine) -> None:
    """Turn a freshly created schema back into what version 5 created (and the versions after it
    recorded: version 7's column too)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE outbox_message DROP COLUMN suspect")
        per_consumer = next(
            ix for ix in inbox.indexes if ix.name == "outbox_inbox_consumer_processed_idx"
        )
        conn.execute(DropIndex(per_consumer))  # each database's own words (MySQL: ... ON table)
        conn.exec_driver_sql(
            "CREATE INDEX outbox_inbox_processed_idx ON outbox_inbox (processed_at)"
        )
        conn.execute(delete(schema_version).where(schema_version.c.version >= 6))


def test_version_5_upgrades_to_the_per_consumer_retention_index(engine: Engine) -> None:
    assert SCHEMA_VERSION >= 6
    outbox.create_schema(engine)
    as_version_5(engine)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        assert current_version(conn) == 5
        conn.execute(
            insert(inbox),
            [{"consumer": c, "message_id": "m1", "processed_at": now} for c in ("a", "b")],
        )
    assert inbox_indexes(engine) == {"outbox_inbox_processed_idx": ["processed_at"]}

    outbox.create_schema(engine)
    outbox.create_schema(engine)  # safe to run again

    assert inbox_indexes(engine) == {
        "outbox_inbox_consumer_processed_idx": ["consumer", "processed_at"]
    }
    with engine.connect() as conn:
        assert current_version(conn) == SCHEMA_VERSION
        assert conn.execute(select(func.count()).select_from(inbox)).scalar_one() == 2
        versions = conn.execute(select(schema_version.c.version)).scalars().all()
    assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1))


def test_a_new_schema_has_only_the_per_consumer_index(engine: Engine) -> None:
    outbox.create_schema(engine)
    assert inbox_indexes(engine) == {
        "outbox_inbox_consumer_processed_idx": ["consumer", "processed_at"]
    }
