"""A hot key's statements never read its published rows (PostgreSQL), whatever the statistics say.

The state is the one a burst leaves: statistics taken while every row of the table was pending on
one key (what autovacuum's ANALYZE does in the middle of a burst), then most of the key published.
Each statement the relay's store runs on outbox_message is EXPLAIN ANALYZEd just before it runs
(same parameters, the relay loop's session settings, rolled back), and its scans of outbox_message
may throw away at most as many rows as the key has in its backlog, never its published ones.

Two such states: most of the key published (its next run's head check), and a key whose old
head is followed by other keys' published rows (its run, and the next message after its head).

What this guards against: a head check probed along the primary key from the table's first row,
through every published row of the key, so that each claim costs more the more of the key is
published, and a claim of many candidates walks the key's published rows once for each.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event

from relay.loop import chains
from relay.store.sql_store import SqlStore, open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROWS = 20_500
PUBLISHED = 20_000  # the first rows of the key
BACKLOG = ROWS - PUBLISHED
KEY = "tenant-1"

_FILL = """
INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, state, key, held,
    attempts, available_at, created_at)
SELECT gen_random_uuid(), 'x', 'r', '\\x7b7d'::bytea, 'application/json', 'pending', %(key)s,
    false, 0, now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1, %(rows)s)
"""


def burst_then(pg_url: str, pg_engine: Engine, change: str) -> Iterator[SqlStore]:
    """ROWS messages of one key, analyzed while all pending (a burst); then `change` (binding
    :n, PUBLISHED) runs, and the relay loop's store is opened on the table."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(_FILL, {"key": KEY, "rows": ROWS})
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox_message")
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(change, {"n": PUBLISHED})
    store = open_store(pg_url, relaxed_commit=True)  # as the relay loop opens it
    yield store
    store.close()


@pytest.fixture
def after_a_burst(pg_url: str, pg_engine: Engine) -> Iterator[SqlStore]:
    """The relay loop's store on a table whose statistics were taken during the burst."""
    yield from burst_then(
        pg_url,
        pg_engine,
        "UPDATE outbox_message SET state = 'published', published_at = now() "
        "WHERE seq <= (SELECT min(seq) FROM outbox_message) + %(n)s - 1",
    )


def discarded_rows(store: SqlStore, action: Callable[[SqlStore], object]) -> dict[str, int]:
    """Run `action`; for each statement it ran on outbox_message, the rows that statement's
    scans of outbox_message read and threw away (EXPLAIN ANALYZE just before it ran)."""
    found: dict[str, int] = {}

    def explain(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "outbox_message" not in statement or statement.lstrip().startswith("EXPLAIN"):
            return
        # A connection of the loop's own engine: the same session settings (no seqscan, ...).
        with store.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin() as tx:
                (plan,) = conn.exec_driver_sql(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params
                ).scalar_one()
                tx.rollback()
        name = statement.split()[0] + " " + str(len(found))
        found[name] = sum(
            int(n.get("Rows Removed by Filter", 0)) * int(n.get("Actual Loops", 1))
            for n in walk(plan["Plan"])
            if n.get("Relation Name") == "outbox_message"
        )

    event.listen(store.engine, "before_cursor_execute", explain)
    try:
        action(store)
    finally:
        event.remove(store.engine, "before_cursor_execute", explain)
    assert found, "no statement on outbox_message ran"
    return found


def walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def claim(store: SqlStore, token: uuid.UUID) -> list[int]:
    rows = store.claim(
        owner="r1", token=token, limit=500, lease_seconds=30.0, suspect_group=100, run=chains.RUN
    )
    return [row.seq for row in rows]


def test_claiming_a_hot_keys_next_run_reads_none_of_its_published_rows(
    after_a_burst: SqlStore,
) -> None:
    seqs: list[int] = []
    thrown = discarded_rows(after_a_burst, lambda s: seqs.extend(claim(s, uuid.uuid4())))
    assert len(seqs) == 1 + chains.RUN  # the head and its run
    assert max(thrown.values()) <= BACKLOG, thrown


def test_marking_a_run_unparks_the_next_without_reading_the_published_rows(
    after_a_burst: SqlStore,
) -> None:
    store = after_a_burst
    token = uuid.uuid4()
    seqs = claim(store, token)  # parks the rest of the backlog
    thrown = discarded_rows(store, lambda s: s.mark_published(token, seqs))
    assert max(thrown.values()) <= BACKLOG, thrown
    # The next head was unparked: it is claimed, with its run.
    assert len(claim(store, uuid.uuid4())) == 1 + chains.RUN


def test_extending_a_chain_reads_none_of_the_published_rows(after_a_burst: SqlStore) -> None:
    store = after_a_burst
    token = uuid.uuid4()
    seqs = claim(store, token)
    got: list[int] = []

    def extend(s: SqlStore) -> None:
        rows = s.claim_run(
            owner="r1", token=token, after=max(seqs), limit=chains.NEXT_RUN, lease_seconds=30.0
        )
        got.extend(row.seq for row in rows)

    thrown = discarded_rows(store, extend)
    assert len(got) == chains.NEXT_RUN
    assert max(thrown.values()) <= BACKLOG, thrown


def test_the_unpark_sweep_reads_none_of_the_published_rows(after_a_burst: SqlStore) -> None:
    store = after_a_burst
    token = uuid.uuid4()
    seqs = claim(store, token)
    store.release(token, seqs, delay_seconds=0.0, error="given back")  # nothing unparks
    thrown = discarded_rows(store, lambda s: s.unpark_sweep())
    assert max(thrown.values()) <= BACKLOG, thrown


@pytest.fixture
def interleaved(pg_url: str, pg_engine: Engine) -> Iterator[SqlStore]:
    """Statistics from a burst on one key; then that key's head is an old message (being
    retried, say) with a short backlog, behind many published messages of other keys."""
    yield from burst_then(
        pg_url,
        pg_engine,
        "UPDATE outbox_message SET state = 'published', published_at = now(), "
        "key = 'other-' || mod(seq, 50) "
        "WHERE seq > (SELECT min(seq) FROM outbox_message) "
        "AND seq < (SELECT min(seq) FROM outbox_message) + %(n)s",
    )


def test_a_keys_run_and_next_message_are_found_without_reading_other_keys_published_rows(
    interleaved: SqlStore,
) -> None:
    store = interleaved
    token = uuid.uuid4()
    seqs: list[int] = []
    thrown = discarded_rows(store, lambda s: seqs.extend(claim(s, token)))
    assert len(seqs) == 1 + chains.RUN
    assert max(thrown.values()) <= BACKLOG, thrown
    # The head alone: the key's next message is the first of the run, far after it.
    thrown = discarded_rows(store, lambda s: s.mark_published(token, [min(seqs)]))
    assert max(thrown.values()) <= BACKLOG, thrown
