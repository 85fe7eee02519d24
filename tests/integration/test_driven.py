"""The hot path's statements on the driver's own cursor (relay/store/driven.py): a driver error is
the outage SQLAlchemy's path would make of it, a connection it shows is gone leaves the pool, and
a listener of the engine's cursor events still sees each statement."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError

from relay.errors import DatabaseUnavailable
from relay.store.sql_store import SqlStore, open_store
from tests.integration.test_leases import enqueue_many

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def pg_store(pg_url: str) -> Any:
    store = open_store(pg_url)
    try:
        yield store
    finally:
        store.close()


def _backend_of(store: SqlStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_claim_on_a_connection_the_server_dropped_is_an_outage_and_the_next_one_works(
    pg_engine: Engine, pg_store: SqlStore
) -> None:
    enqueue_many(pg_engine, 3)
    pid = _backend_of(pg_store)  # the pooled connection the next claim is lent
    with pg_engine.connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        admin.commit()
    with pytest.raises(DatabaseUnavailable, match="terminating connection"):
        pg_store.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=30)
    # The dropped connection left the pool: the claim after it gets a fresh one.
    token = uuid.uuid4()
    claimed = pg_store.claim(owner="r", token=token, limit=10, lease_seconds=30)
    assert len(claimed) == 3
    assert pg_store.mark_published(token, [c.seq for c in claimed]) == 3
    assert _backend_of(pg_store) != pid


def test_a_statement_the_server_refuses_is_raised_as_sqlalchemy_raises_it(
    pg_engine: Engine, pg_store: SqlStore
) -> None:
    enqueue_many(pg_engine, 1)
    # A lease of infinite seconds: the server refuses the interval, the statement fails as written.
    with pytest.raises(DBAPIError, match="interval out of range") as caught:
        pg_store.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=float("inf"))
    assert not isinstance(caught.value, DatabaseUnavailable)
    (again,) = pg_store.claim(owner="r", token=uuid.uuid4(), limit=10, lease_seconds=30)
    assert again.attempts == 1  # the refused claim changed nothing


def test_a_cursor_event_listener_still_sees_the_claim_and_the_mark(
    pg_engine: Engine, pg_store: SqlStore
) -> None:
    enqueue_many(pg_engine, 2)
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(pg_store.engine, "before_cursor_execute", record)
    try:
        token = uuid.uuid4()
        claimed = pg_store.claim(owner="r", token=token, limit=10, lease_seconds=30)
        assert pg_store.mark_published(token, [c.seq for c in claimed]) == 2
    finally:
        event.remove(pg_store.engine, "before_cursor_execute", record)
    assert [type(c.id) for c in claimed] == [str, str]
    assert any("lease_token = %(token)s" in s and "RETURNING m.seq" in s for s in seen)
    assert any(
        s.startswith("WITH done AS ( UPDATE outbox_message SET state = 'published'") for s in seen
    )
