"""Status, the state gauges and the console's counts beside many published rows (PostgreSQL).

Every statement they run is captured as it runs and EXPLAINed with its own parameters, with the
planner's defaults and real statistics (VACUUM ANALYZE after the rows are in): none may read
outbox_message sequentially, and each reads it through a partial index. The exact figures are
compared with a count of the rows, the estimated ones with it within a tolerance, and the
estimates must follow deletes (retention) at once and survive a reset of the statistics.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, select

import outbox
from outbox.schema import message
from relay.store import admin
from relay.store.databases import dialect_for
from relay.store.estimates import EXACT_PAGES
from relay.store.sql_store import SqlStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PUBLISHED = 100_000  # ~1,700 pages of these rows: well past EXACT_PAGES
CANCELLED = 2_000  # common enough for ANALYZE's sample to see
# The partial indexes of outbox/schema.py: what counting may read outbox_message through.
PARTIAL = {
    "outbox_message_ready_idx",
    "outbox_message_ready_keyed_idx",
    "outbox_message_key_idx",
    "outbox_message_lease_idx",
    "outbox_message_failed_idx",
}

# Rows written straight in: ids of a past moment, numbered (UUIDv7-shaped and in order, so the
# id index is appended to); `g` numbers them. available_at: due an hour ago, or in a day.
_FILL = """
INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, state, key, held,
    attempts, available_at, created_at, published_at, lease_expires_at, last_failed_at)
SELECT ('018f0000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
    CASE WHEN mod(g, 10) < 7 THEN 'a' ELSE 'b' END, 'r', '\\x7b7d'::bytea, 'application/json',
    CAST(%(state)s AS text), %(key)s, %(held)s, 1, now() + make_interval(secs => %(due_in)s),
    now() - interval '1 hour',
    CASE WHEN CAST(%(state)s AS text) = 'published' THEN now() - interval '1 hour' END,
    CASE WHEN CAST(%(state)s AS text) = 'in_flight' THEN now() + interval '30 seconds' END,
    CASE WHEN CAST(%(state)s AS text) IN ('dead', 'discarded') THEN now() END
FROM generate_series(%(first)s, %(last)s) AS g
"""


@dataclass(frozen=True)
class Rows:
    count: int
    state: str
    key: str | None = None
    held: bool = False
    due_in: float = -3600.0


# Beside the published and cancelled rows: the backlog and the failures, with exact figures.
BACKLOG = [
    Rows(5, "pending"),  # unkeyed, due
    Rows(3, "pending", due_in=86400.0),  # unkeyed, delayed
    Rows(1, "pending", key="k1"),  # a key's head, due
    Rows(4, "pending", key="k1", held=True),  # parked behind it, due
    Rows(6, "in_flight"),
    Rows(4, "dead"),
    Rows(7, "discarded"),
]
EXACT = {"pending": 13, "in_flight": 6, "dead": 4, "discarded": 7}


def fill(engine: Engine, rows: list[Rows], first: int = 1) -> int:
    """Write `rows` (ids numbered from `first`); return the next free number."""
    with engine.begin() as conn:
        for r in rows:
            params = {"state": r.state, "key": r.key, "held": r.held, "due_in": r.due_in,
                      "first": first, "last": first + r.count - 1}  # fmt: skip
            conn.exec_driver_sql(_FILL, params)
            first += r.count
        # Report these rows to the statistics as the transaction ends, before the VACUUM: a
        # report that comes after it would be counted on top of what it found.
        conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")
    return first


def vacuum_analyze(engine: Engine) -> None:
    # What autovacuum does to a live table (it is off on this machine): statistics, and the
    # visibility map that lets index-only scans skip the heap.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox_message")


def true_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        found = conn.execute(select(message.c.state, func.count()).group_by(message.c.state))
        return {str(state): int(n) for state, n in found}


@contextmanager
def own_schema(pg_admin: Engine) -> Iterator[Engine]:
    """An engine on a schema of this module's own, with the outbox tables; dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    engine = create_engine(
        pg_admin.url.update_query_dict({"options": f"-csearch_path={schema}"}), pool_size=2
    )
    try:
        outbox.create_schema(engine)
        yield engine
    finally:
        engine.dispose()
        with pg_admin.connect() as conn:
            conn.exec_driver_sql("SET lock_timeout = '10s'")
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def large(engine: Engine) -> None:
    """The backlog beside PUBLISHED published and CANCELLED cancelled rows, analyzed."""
    following = fill(engine, [Rows(PUBLISHED, "published"), Rows(CANCELLED, "cancelled")])
    fill(engine, BACKLOG, first=following)
    vacuum_analyze(engine)


@pytest.fixture(scope="module")
def beside_many(pg_admin: Engine) -> Iterator[Engine]:
    """A schema of its own holding `large()`; the tests using it only read."""
    with own_schema(pg_admin) as engine:
        large(engine)
        yield engine


@pytest.fixture
def beside_many_of_mine(pg_admin: Engine) -> Iterator[Engine]:
    """The same, for a test that changes it."""
    with own_schema(pg_admin) as engine:
        large(engine)
        yield engine


def test_the_table_is_large_enough_to_estimate(beside_many: Engine) -> None:
    with beside_many.connect() as conn:
        pages = conn.exec_driver_sql(
            "SELECT pg_relation_size('outbox_message') / current_setting('block_size')::int"
        ).scalar_one()
    assert pages > EXACT_PAGES


def test_no_statement_of_status_or_the_gauges_reads_the_table_sequentially(
    beside_many: Engine,
) -> None:
    ran: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        ran.append((statement, params))

    event.listen(beside_many, "before_cursor_execute", capture)
    try:
        SqlStore(beside_many).counts()
        admin.per_exchange(beside_many, dt.datetime.now(dt.UTC))
    finally:
        event.remove(beside_many, "before_cursor_execute", capture)
    counting = [(s, p) for s, p in ran if "outbox_message" in s]
    assert len(counting) >= 4, ran  # the table's figures, pending, the other states, by exchange

    used: set[str] = set()
    dialect = dialect_for("postgresql")
    with beside_many.connect() as conn, dialect.reading(conn):  # as counting runs them
        for statement, params in counting:
            explain = f"EXPLAIN (FORMAT JSON) {statement}"
            (plan,) = conn.exec_driver_sql(explain, params).scalar_one()
            nodes = list(walk(plan["Plan"]))
            scans = [n for n in nodes if n.get("Relation Name") == "outbox_message"]
            assert all(n["Node Type"] != "Seq Scan" for n in scans), (statement, plan)
            assert not any(n.get("Parallel Aware") or "Gather" in n["Node Type"] for n in nodes)
            indexes = {
                n["Index Name"] for n in nodes if n.get("Index Name", "").startswith("outbox")
            }
            assert indexes <= PARTIAL, (statement, indexes)
            used |= indexes
    assert used == PARTIAL  # every partial index does its part


def test_counting_runs_without_parallel_workers_in_a_transaction_of_its_own(
    beside_many: Engine,
) -> None:
    # A setting for the counting transaction only: nothing is left on the connection after it
    # (a pooler lends server connections to others), on the store's autocommit connection and
    # inside an operator's transaction alike.
    dialect = dialect_for("postgresql")
    setting = "SHOW max_parallel_workers_per_gather"
    autocommit = beside_many.execution_options(isolation_level="AUTOCOMMIT")
    for engine in (autocommit, beside_many):
        with engine.connect() as conn:
            before = conn.exec_driver_sql(setting).scalar_one()
            assert before != "0"
            with dialect.reading(conn):
                assert conn.exec_driver_sql(setting).scalar_one() == "0"
                assert conn.exec_driver_sql("SHOW transaction_read_only").scalar_one() == (
                    "on" if engine is autocommit else "off"
                )
            conn.commit()
            assert conn.exec_driver_sql(setting).scalar_one() == before


def walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def test_the_backlog_and_failures_are_exact_and_published_and_cancelled_estimated(
    beside_many: Engine,
) -> None:
    counts = SqlStore(beside_many).counts()
    truth = true_counts(beside_many)
    assert counts.estimated == {"published", "cancelled"}
    assert {s: counts.by_state[s] for s in EXACT} == EXACT == {s: truth[s] for s in EXACT}
    assert (counts.ready, counts.delayed) == (10, 3)  # parked rows that are due count as ready
    assert counts.oldest_ready_age_s is not None
    assert 3590 < counts.oldest_ready_age_s < 3700
    # All the rest is settled: only the split between the two comes from ANALYZE's sample.
    assert counts.by_state["published"] + counts.by_state["cancelled"] == PUBLISHED + CANCELLED
    assert counts.by_state["cancelled"] == pytest.approx(truth["cancelled"], rel=0.15)


def test_per_exchange_the_backlog_is_exact_and_the_rest_estimated(beside_many: Engine) -> None:
    now = dt.datetime.now(dt.UTC)
    got = {e["exchange"]: e for e in admin.per_exchange(beside_many, now)}
    with beside_many.connect() as conn:
        found = conn.execute(
            select(message.c.exchange, message.c.state, func.count()).group_by(
                message.c.exchange, message.c.state
            )
        )
        truth: dict[str, dict[str, int]] = {}
        for exchange, state, n in found:
            truth.setdefault(exchange, {})[state] = n
    assert set(got) == set(truth) == {"a", "b"}
    for exchange, entry in got.items():
        assert entry["estimated"] == ["cancelled", "published"]
        for state in EXACT:
            assert entry[state] == truth[exchange].get(state, 0), (exchange, state)
        published = truth[exchange]["published"]
        assert entry["published"] == pytest.approx(published, rel=0.05), exchange
    assert got["a"]["oldest_ready_age_s"] is not None
    assert got["a"]["oldest_ready_age_s"] > 3590


def test_estimates_follow_deletes_at_once_and_survive_a_reset_of_the_statistics(
    beside_many_of_mine: Engine,
) -> None:
    engine = beside_many_of_mine
    store = SqlStore(engine)
    before = store.counts().by_state["published"] + store.counts().by_state["cancelled"]
    # Retention deletes: the running count follows as the transaction ends (the flush that
    # happens within a second or so on its own is forced, so the test need not wait).
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "DELETE FROM outbox_message WHERE state = 'published' AND mod(seq, 10) = 0"
        )
        conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")
    after = store.counts()
    truth = true_counts(engine)
    assert truth["published"] < PUBLISHED - 9_000
    settled = after.by_state["published"] + after.by_state["cancelled"]
    assert settled == pytest.approx(truth["published"] + truth["cancelled"], abs=100)
    assert before - settled == pytest.approx(PUBLISHED + CANCELLED - settled, abs=100)

    # A crash resets the statistics: the planner's figure from the last VACUUM stands in.
    vacuum_analyze(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "SELECT pg_stat_reset_single_table_counters('outbox_message'::regclass)"
        )
        reset = conn.exec_driver_sql(
            "SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'outbox_message'::regclass"
        ).scalar_one()
    assert reset == 0
    again = store.counts()
    assert again.estimated == {"published", "cancelled"}
    settled = again.by_state["published"] + again.by_state["cancelled"]
    assert settled == pytest.approx(truth["published"] + truth["cancelled"], rel=0.02)
    assert {s: again.by_state[s] for s in EXACT} == EXACT


def test_status_json_says_which_figures_are_estimates(
    beside_many: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    from relay.cli.main import main

    url = beside_many.url.render_as_string(hide_password=False)
    assert main(["--db", url, "status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["estimated"] == ["cancelled", "published"]
    assert {s: report[s] for s in EXACT} == EXACT
    assert all(e["estimated"] == ["cancelled", "published"] for e in report["exchanges"])
    assert main(["--db", url, "status"]) == 0
    text = capsys.readouterr().out
    assert re.search(rf"^published +~{report['published']}$", text, re.M), text
    assert "\n~ estimated from the database's statistics" in text


def test_sqlite_counts_exactly_through_the_partial_indexes_but_published_and_cancelled(
    sqlite_url: str,
) -> None:
    # SQLite keeps no statistics to estimate from: published and cancelled are counted, by the
    # one scan of the table each figure needs; everything else through the partial indexes.
    engine = create_engine(sqlite_url)
    outbox.create_schema(engine)
    with engine.begin() as conn:
        ids = [outbox.enqueue(conn, exchange="a", routing_key="r", payload=[n]) for n in range(4)]
        outbox.enqueue(conn, exchange="b", routing_key="r", payload=[9], key="k")
        conn.execute(message.update().where(message.c.id == ids[0]).values(state="published"))
    ran: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        ran.append((statement, params))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        counts = SqlStore(engine).counts()
        exchanges = admin.per_exchange(engine, dt.datetime.now(dt.UTC))
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert (counts.by_state, counts.estimated) == ({"pending": 4, "published": 1}, frozenset())
    assert [(e["exchange"], e["pending"], e["published"], e["estimated"]) for e in exchanges] == [
        ("a", 3, 1, []),
        ("b", 1, 0, []),
    ]
    scanning = []
    with engine.connect() as conn:
        for statement, params in ran:
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
            # Reads of the table, under its name or its alias (not of a subquery's result).
            reads = [
                row[-1] for row in plan if re.match(r"(SCAN|SEARCH) (outbox_message|m)\b", row[-1])
            ]
            assert reads or "outbox_message" not in statement, (statement, plan)
            if any("INDEX" not in read for read in reads):
                scanning.append(statement)
    assert len(scanning) == 2, scanning  # the state counts' and the per-exchange ones
    assert all("state IN ('published', 'cancelled')" in s for s in scanning), scanning
    engine.dispose()
