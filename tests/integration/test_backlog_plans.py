"""A claim reads what it claims, not the backlog, even on its generic plan (PostgreSQL).

The relay loop prepares its statements on a direct connection, and after a few runs PostgreSQL plans
a prepared statement once for any parameters (the generic plan). For the claim it can guess that one
row or so would pass the resource filter and the due time, and choose to read every pending row
through a bitmap of the ready index, then sort them, to keep the first `limit`: slower than reading
the index in order, and the slower the longer the backlog (an outage's backlog is when the drain
matters most). So the loop's connections plan no bitmap scans. The claim is run here on its generic
plan (forced), inside a transaction that is rolled back, and the rows it fetched from outbox_message
are counted from that transaction's own statistics.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url

from relay.loop import chains
from relay.store.databases import dialect_for
from relay.store.sql_store import SqlStore, open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BACKLOG = 20_000
LIMIT = 500

_FILL = """
INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, state, held,
    attempts, available_at, created_at)
SELECT gen_random_uuid(), 'x', 'r', '\\x7b7d'::bytea, 'application/json', 'pending', false, 0,
    now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1, %(rows)s)
"""

_FETCHED = """
SELECT coalesce(sum(idx_tup_fetch), 0) + coalesce(sum(seq_tup_read), 0)
FROM pg_stat_xact_user_tables WHERE relname = 'outbox_message'
"""


@pytest.fixture
def backlog(pg_url: str, pg_engine: Engine) -> Iterator[SqlStore]:
    """An outage's backlog: BACKLOG unkeyed messages pending, analyzed."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(_FILL, {"rows": BACKLOG})
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox_message")
    store = open_store(pg_url, relaxed_commit=True)  # as the relay loop opens it
    yield store
    store.close()


def fetched_by_a_generic_claim(store: SqlStore, pg_url: str) -> tuple[int, int]:
    """(rows claimed, rows fetched from outbox_message) for one claim on its generic plan, with
    the loop's session settings, rolled back."""
    relaxed = dialect_for("postgresql").relaxed_commit
    assert relaxed is not None
    # Every statement prepared at once (psycopg), and planned once for any parameters.
    engine = create_engine(make_url(pg_url), connect_args={"prepare_threshold": 0})
    params = {
        "owner": "r1", "token": uuid.uuid4(), "limit": LIMIT, "scan": 2 * LIMIT,
        "lease_seconds": 30.0, "exclude": [], "only": None, "group": 100,
        "run": chains.RUN, "follow": LIMIT, "alone": "a", "grouped": "g", "solitary": "s",
        "now": None,
    }  # fmt: skip
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(relaxed)
            conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            before = conn.exec_driver_sql(_FETCHED).scalar_one()
            claimed = len(store.dialect.claim(conn, params))
            after = conn.exec_driver_sql(_FETCHED).scalar_one()
            conn.rollback()
    finally:
        engine.dispose()
    return claimed, int(after) - int(before)


def test_a_claim_on_its_generic_plan_reads_its_rows_not_the_backlog(
    backlog: SqlStore, pg_url: str
) -> None:
    claimed, fetched = fetched_by_a_generic_claim(backlog, pg_url)
    assert claimed == LIMIT
    assert fetched <= 3 * LIMIT, fetched  # each claimed row read a few times, never all 20,000
