"""The store's budgets and bookkeeping at the edges: a release costs no attempt, a busy pool is an
outage (not a crash), the probes have a pool of their own, statements have a timeout, and a
retention pass fails without taking the relay down."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.pool import QueuePool

from outbox.schema import message
from relay.core.retention import RetentionPolicy
from relay.errors import DatabaseUnavailable
from relay.ports import RetentionFailed
from relay.store.engines import make_engine
from relay.store.sql_store import SqlStore, open_store
from tests.integration.test_leases import enqueue_many

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_rows_given_back_unsent_cost_no_attempt(app_engine: Engine, store: SqlStore) -> None:
    enqueue_many(app_engine, 2)
    token = uuid.uuid4()
    claimed = store.claim(owner="stopping", token=token, limit=10, lease_seconds=30)
    assert [c.attempts for c in claimed] == [1, 1]
    assert store.release(token, [c.seq for c in claimed], delay_seconds=0, error="stop") == 2
    with app_engine.connect() as conn:
        assert conn.execute(select(message.c.attempts)).scalars().all() == [0, 0]
    again = store.claim(owner="next", token=uuid.uuid4(), limit=10, lease_seconds=30)
    assert [(c.attempts, c.suspect) for c in again] == [(1, False), (1, False)]


def test_a_pool_with_no_free_connection_is_an_outage_not_a_crash(
    db_url: str, app_engine: Engine
) -> None:
    engine = make_engine(db_url)
    # One connection, and a short wait for it.
    engine.pool = QueuePool(engine.pool._creator, pool_size=1, max_overflow=0, timeout=0.2)
    store = SqlStore(engine)
    try:
        with (
            engine.connect(),
            pytest.raises(DatabaseUnavailable, match="no free connection"),
        ):
            store.reclaim_expired(relay_id="r")
    finally:
        store.close()


def test_probes_have_their_own_pool(db_url: str, app_engine: Engine) -> None:
    store = open_store(db_url)
    try:
        store.engine.pool = QueuePool(
            store.engine.pool._creator, pool_size=1, max_overflow=0, timeout=0.2
        )
        held = [store.engine.connect()]  # the loop's pool, all of it
        try:
            store.ping()  # /readyz still answers
            assert store.counts().by_state == {}
        finally:
            for conn in held:
                conn.close()
    finally:
        store.close()


def test_the_relays_statements_have_a_timeout(pg_url: str, pg_engine: Engine) -> None:
    store = open_store(pg_url, statement_timeout=1.5)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "1500ms"
        with (
            pytest.raises(DatabaseUnavailable, match="canceling statement"),
            store._conn() as conn,
        ):
            conn.execute(text("SELECT pg_sleep(3)"))
    finally:
        store.close()


def test_a_retention_failure_that_is_not_an_outage_is_retention_failed(
    pg_url: str, pg_engine: Engine
) -> None:
    store = open_store(pg_url)
    try:
        with pg_engine.begin() as conn:  # a constraint the purge trips over, every time
            conn.execute(
                text(
                    "CREATE FUNCTION outbox_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'retention refused' USING ERRCODE = '42501'; END $$"
                )
            )
            conn.execute(
                text(
                    "CREATE TRIGGER outbox_refuse BEFORE DELETE ON outbox_message "
                    "FOR EACH ROW EXECUTE FUNCTION outbox_refuse()"
                )
            )
        enqueue_many(pg_engine, 1)
        long_ago = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        with pg_engine.begin() as conn:
            conn.execute(
                message.update().values(
                    state="published", published_at=long_ago, created_at=long_ago
                )
            )
        policy = RetentionPolicy(published_after=1.0)
        with pytest.raises(RetentionFailed, match="retention refused"):
            store.purge_expired(policy, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    finally:
        store.close()
