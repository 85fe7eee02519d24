"""Messages by state, for `status`, the state gauges and the console: what each of them reads.

Pending, in-flight, dead and discarded rows are counted exactly, through the partial indexes that
hold them (common.sql's pending_unkeyed and its siblings, count_open): the backlog and the
failures, never a published row. Published and cancelled rows have no index apart from each other
and from the published ones, so they are counted exactly only while the table is small; beside a
large one they are estimated from what the database keeps about the table
(relay/store/estimates.py), and said to be (StateCounts.estimated, and `estimated` in each
per-exchange entry). A database that keeps nothing usable (SQLite, MySQL for now:
Dialect.table_stats) counts them exactly at any size.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection

from outbox.states import State
from relay.ports import StateCounts
from relay.store import estimates
from relay.store.dialect import Dialect
from relay.store.estimates import ESTIMATED, TableStats


def _exact(stats: TableStats | None) -> bool:
    return stats is None or stats.small


def state_counts(dialect: Dialect, conn: Connection, now: dt.datetime | None) -> StateCounts:
    """Every state's count (states without rows left out), ready and delayed, and the oldest
    ready age. `now` is bound as :now (None: the database's clock)."""
    with dialect.reading(conn):
        stats = dialect.table_stats(conn)
        ready, delayed, age = conn.execute(dialect.sql.pending_summary, {"now": now}).one()
        ready, delayed = int(ready or 0), int(delayed or 0)
        by_state = {State.PENDING.value: ready + delayed}
        by_state.update(_pairs(conn.execute(dialect.sql.count_open)))
        exact = _exact(stats)
        if exact:
            by_state.update(_pairs(conn.execute(dialect.sql.count_settled)))
    estimated: frozenset[str] = frozenset()
    if not exact:
        assert stats is not None
        by_state.update(estimates.settled(stats, by_state))
        estimated = ESTIMATED
    oldest = None if age is None else max(0.0, float(age))
    counts = {state: n for state, n in by_state.items() if n}
    return StateCounts(counts, ready, delayed, oldest, estimated)


def exchange_counts(dialect: Dialect, conn: Connection, now: dt.datetime) -> list[dict[str, Any]]:
    """Per exchange, by name: the count of every state (None where not even an estimate can be
    made), `oldest_ready_age_s` and `estimated` (the states whose figures are estimates)."""
    counted: dict[str, dict[str, int]] = {}
    oldest: dict[str, dt.datetime] = {}
    settled: dict[str, dict[str, int | None]] = {}
    with dialect.reading(conn):
        stats = dialect.table_stats(conn)
        for row in conn.execute(dialect.sql.exchange_open, {"now": now}):
            mine = counted.setdefault(row.exchange, {})
            mine[row.state] = mine.get(row.state, 0) + int(row.n)
            if row.oldest is not None:
                due = _utc(row.oldest)
                oldest[row.exchange] = min(due, oldest.get(row.exchange, due))
        if _exact(stats):
            for exchange, state, n in conn.execute(dialect.sql.exchange_settled):
                settled.setdefault(exchange, {})[state] = int(n)
    estimated: list[str] = []
    if not _exact(stats):
        assert stats is not None
        totals: dict[str, int] = {}
        for mine in counted.values():
            for state, n in mine.items():
                totals[state] = totals.get(state, 0) + n
        settled = estimates.per_exchange(stats, estimates.settled(stats, totals), counted)
        estimated = sorted(ESTIMATED)
    out: list[dict[str, Any]] = []
    for exchange in sorted(set(counted) | set(settled)):
        entry: dict[str, Any] = {"exchange": exchange}
        for state in State:
            if state.value in ESTIMATED:
                entry[state.value] = settled.get(exchange, {}).get(state.value, 0)
            else:
                entry[state.value] = counted.get(exchange, {}).get(state.value, 0)
        first = oldest.get(exchange)
        entry["oldest_ready_age_s"] = (
            None if first is None else round(max(0.0, (now - first).total_seconds()), 3)
        )
        entry["estimated"] = estimated
        out.append(entry)
    return out


def _pairs(rows: Iterable[Any]) -> dict[str, int]:
    return {str(state): int(n) for state, n in rows}


def _utc(value: dt.datetime) -> dt.datetime:
    # SQLite and MySQL hand back naive datetimes; every time stored here is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
