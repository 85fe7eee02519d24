"""Schema version 7: outbox_message.suspect, the crash suspects' own column. A database at version 6
upgrades in place, and the rows relays of schema 6 marked as suspects in their own way (a pending
row's lease_expires_at, outbox.states' STAMP_* texts in last_error) get the column's value."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, inspect, select

import outbox
from outbox.migrate import current_version
from outbox.schema import SCHEMA_VERSION, message, schema_version
from outbox.states import STAMP_ALONE, STAMP_GROUPED, STAMP_SOLITARY
from relay.store.sql_store import open_store
from tests.support.db import make_app_engine

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
EARLIER = NOW - dt.timedelta(minutes=1)
WHY = "lease held by r1 expired before it settled"

# (state, lease_expires_at, last_error) as schema 6's relays left a row -> its suspect column
ROWS: dict[str, tuple[str, dt.datetime | None, str | None, str | None]] = {
    "waiting in a group": ("pending", EARLIER, WHY, "group"),
    "waiting to go alone": ("pending", EARLIER, STAMP_SOLITARY, "alone"),
    "claimed in a group": ("in_flight", NOW, STAMP_GROUPED, "group"),
    "claimed alone": ("in_flight", NOW, STAMP_ALONE, "alone"),
    "dead of crashes": ("dead", EARLIER, WHY, "group"),  # a suspect again if replayed
    "pending": ("pending", None, None, None),
    "retrying": ("pending", None, "a nack", None),
    "in flight": ("in_flight", NOW, None, None),
    "dead of a nack": ("dead", None, "a nack", None),
    "published": ("published", None, None, None),
}


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_app_engine(db_url)
    yield engine
    engine.dispose()


def as_version_6(engine: Engine) -> None:
    """Turn a freshly created schema back into what version 6 created."""
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE outbox_message DROP COLUMN suspect")
        conn.execute(delete(schema_version).where(schema_version.c.version >= 7))


def columns(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {str(c["name"]) for c in inspect(conn).get_columns("outbox_message")}


def put_rows(engine: Engine) -> dict[str, uuid.UUID]:
    """The rows, written in version 6's columns only."""
    ids = {name: uuid.uuid4() for name in ROWS}
    with engine.begin() as conn:
        for name, (state, expires, error, _) in ROWS.items():
            values: dict[str, Any] = {
                "id": ids[name],
                "exchange": "ex",
                "routing_key": "rk",
                "payload": b"{}",
                "content_type": "application/json",
                "state": state,
                "created_at": NOW - dt.timedelta(hours=1),
                "available_at": EARLIER,
                "lease_expires_at": expires,
                "last_error": error,
                "lease_owner": "r1" if state == "in_flight" else None,
                "lease_token": uuid.uuid4() if state == "in_flight" else None,
                "attempts": 1,
            }
            # Only the columns given: version 6's (suspect has no default to send).
            conn.execute(insert(message).values(values))
    return ids


def test_version_6_upgrades_to_the_suspect_column_and_marks_its_suspects(engine: Engine) -> None:
    assert SCHEMA_VERSION >= 7
    outbox.create_schema(engine)
    as_version_6(engine)
    with engine.connect() as conn:
        assert current_version(conn) == 6
    assert "suspect" not in columns(engine)
    ids = put_rows(engine)

    outbox.create_schema(engine)
    outbox.create_schema(engine)  # safe to run again

    assert "suspect" in columns(engine)
    with engine.connect() as conn:
        assert current_version(conn) == SCHEMA_VERSION
        found = dict(conn.execute(select(message.c.id, message.c.suspect)).all())
        versions = conn.execute(select(schema_version.c.version)).scalars().all()
    assert {name: found[ids[name]] for name in ROWS} == {
        name: mark for name, (_, _, _, mark) in ROWS.items()
    }
    assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1))


def test_after_the_upgrade_a_suspect_left_to_go_alone_is_claimed_alone(
    engine: Engine, db_url: str
) -> None:
    outbox.create_schema(engine)
    as_version_6(engine)
    ids = put_rows(engine)
    outbox.create_schema(engine)
    store = open_store(db_url, clock=lambda: NOW)
    try:
        claimed = store.claim(
            owner="new", token=uuid.uuid4(), limit=10, lease_seconds=30, suspect_group=10
        )
        assert [(c.id, c.suspect) for c in claimed] == [(str(ids["waiting to go alone"]), True)]
    finally:
        store.close()
