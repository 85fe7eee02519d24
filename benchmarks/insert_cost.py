"""What `outbox.enqueue` costs a one-row transaction, on whichever database `--db` names: one
writer, one transaction at a time, each inserting a business row, with and without an outbox row;
and what `outbox.enqueue_many` saves over as many `enqueue` calls.

On PostgreSQL the outbox row is also set beside the baseline its target is judged against: the
same transaction with a plain INSERT of the same columns into a table with no index and no
constraint (the statement `enqueue` sends, aimed at that table, with values bound the same way).
Two more variants split the difference between them: the same plain INSERT into `outbox_message`
itself (what the database's indexes, CHECK constraint and identity cost, with nothing of the
library), and `enqueue` with NOTIFY off (what the rationed wake-up costs).

A machine's load can move by the second, so the variants run in interleaved rounds and each ratio
is the median over the rounds of that round's ratio. (benchmarks/enqueue_cost.py has the fuller
PostgreSQL comparison: a second plain row, asyncpg, txoutbox, 8 writers.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

import outbox
from benchmarks.enqueue_cost import BUSINESS, PAYLOAD, _business_table, _enqueue
from benchmarks.targets import MANY_MESSAGES
from outbox import pg_insert
from outbox.config import settings
from outbox.ids import new_id
from outbox.many import DEFAULTS
from outbox.prepared import Prepared, prepare

PLAIN_TABLE = "bench_plain_message"
ALONE = "business row alone"
PLAIN = "+ plain INSERT, unindexed table"
RAW = "+ the same INSERT into outbox_message"
ENQUEUE = "+ outbox.enqueue"
QUIET = "+ outbox.enqueue, NOTIFY off"


@dataclass(frozen=True, slots=True)
class InsertCost:
    rates: dict[str, float]  # commits/s per variant (median over rounds)
    ratios: dict[str, float]  # per variant: median over rounds of its rate / the plain INSERT's
    ratio: float  # median over rounds of enqueue's rate / the business row alone's
    rounds: int

    @property
    def plain_ratio(self) -> float | None:
        """enqueue's rate over the plain INSERT's (the target's ratio); None if not measured."""
        return self.ratios.get(ENQUEUE)

    def describe(self) -> str:
        parts = [
            f"one writer: business row alone {self.rates[ALONE]:,.0f} commits/s, with "
            f"outbox.enqueue {self.rates[ENQUEUE]:,.0f} commits/s = {self.ratio:.2f}x"
        ]
        if self.ratios:
            parts.append(
                f"beside a plain INSERT of the same columns into an unindexed table "
                f"({self.rates[PLAIN]:,.0f} commits/s): "
                + ", ".join(
                    f"{name[2:]} {self.rates[name]:,.0f} = {ratio:.2f}x"
                    for name, ratio in self.ratios.items()
                )
            )
        return "; ".join(parts) + f" (median of {self.rounds} interleaved rounds)"


@dataclass(frozen=True, slots=True)
class ManyCost:
    many_s: float  # seconds for enqueue_many of `messages` (median over rounds)
    calls_s: float  # seconds for `messages` enqueue calls in one transaction (median)
    ratio: float  # median over rounds of calls_s / many_s
    messages: int
    rounds: int

    def describe(self) -> str:
        return (
            f"{self.messages:,} messages in one transaction: outbox.enqueue_many "
            f"{self.many_s:.3f} s, {self.messages:,} outbox.enqueue calls {self.calls_s:.3f} s "
            f"= {self.ratio:.1f}x "
            f"(median of {self.rounds} interleaved rounds)"
        )


def _plain_table(engine: Engine) -> None:
    """PostgreSQL: outbox_message's columns and defaults; no index, no constraint, no identity."""
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PLAIN_TABLE}")
        conn.exec_driver_sql(f"CREATE TABLE {PLAIN_TABLE} (LIKE outbox_message INCLUDING DEFAULTS)")


def _prepared(exchange: str) -> Prepared:
    """enqueue's checks and encoding of the benchmark's message, with no SQL."""
    return prepare(**{**DEFAULTS, "exchange": exchange, "routing_key": "r", "payload": PAYLOAD})


def _rate(engine: Engine, seconds: float, extra: Callable[[Connection], object] | None) -> float:
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    with engine.connect() as conn:
        while time.perf_counter() < deadline:
            with conn.begin():
                conn.exec_driver_sql(BUSINESS)
                if extra is not None:
                    extra(conn)
            done += 1
    return done / (time.perf_counter() - started)


def _plain_insert(engine: Engine, table: str) -> Callable[[Connection], object]:
    """enqueue's PostgreSQL statement aimed at `table`, its values built once (a new id each
    time): what the same row costs the database with nothing of the library."""
    rendered = pg_insert._rendered(engine.dialect, notify=False)
    sql = rendered.sql.replace("INSERT INTO outbox_message ", f"INSERT INTO {table} ", 1)
    values = pg_insert.driver_values(_prepared("x"))
    order = rendered.order

    def insert(conn: Connection) -> None:
        params = {**values, "id": str(new_id())}
        if order is None:
            conn.exec_driver_sql(sql, params).close()
        else:
            conn.exec_driver_sql(sql, tuple(params[n] for n in order)).close()

    return insert


def measure_insert_cost(
    engine: Engine, exchange: str, *, rounds: int = 25, seconds: float = 0.4
) -> InsertCost:
    """Interleaved rounds of the kinds of transaction on `engine` (the outbox schema made)."""
    _business_table(engine)
    _plain_table(engine)
    postgresql = engine.dialect.name == "postgresql"
    notify = settings().notify
    enqueue = _enqueue(exchange)

    variants: dict[str, Callable[[Connection], object] | None] = {ALONE: None}
    if postgresql:
        variants[PLAIN] = _plain_insert(engine, PLAIN_TABLE)
        variants[RAW] = _plain_insert(engine, "outbox_message")
    variants[ENQUEUE] = enqueue
    if postgresql:
        variants[QUIET] = enqueue  # with NOTIFY off for its runs
    found: dict[str, list[float]] = {name: [] for name in variants}
    try:
        _rate(engine, 0.5, enqueue)  # warm up: connections, statement caches
        for _ in range(rounds):
            for name, extra in variants.items():
                outbox.configure(notify=notify and name != QUIET)
                found[name].append(_rate(engine, seconds, extra))
    finally:
        outbox.configure(notify=notify)
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS bench_order")
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PLAIN_TABLE}")
            conn.exec_driver_sql("DELETE FROM outbox_message")
    return InsertCost(
        rates={name: statistics.median(values) for name, values in found.items()},
        ratios={name: _ratio(found[name], found[PLAIN]) for name in (RAW, ENQUEUE, QUIET)}
        if postgresql
        else {},
        ratio=_ratio(found[ENQUEUE], found[ALONE]),
        rounds=rounds,
    )


@dataclass(frozen=True, slots=True)
class StatementCost:
    """Microseconds per statement inside one open transaction (no commit in the loop), the
    fastest of the rounds: where one enqueue's time goes, statement by statement."""

    us: dict[str, float]
    statements: int
    rounds: int

    def describe(self) -> str:
        each = ", ".join(f"{name} {us:.0f} us" for name, us in self.us.items())
        return (
            f"per statement, {self.statements:,} in one transaction (fastest of {self.rounds} "
            f"rounds): {each}"
        )


def measure_statement_cost(
    engine: Engine, exchange: str, *, statements: int = 2_000, rounds: int = 7
) -> StatementCost:
    """PostgreSQL: a plain INSERT into an unindexed table, the same INSERT into outbox_message
    (the difference: the database's indexes, CHECK and identity), that INSERT after enqueue's
    checks (`prepare`: what they cost between round trips, caches cold), outbox.enqueue with
    NOTIFY off (beyond that: the library's own work) and enqueue's checks alone, with no SQL
    (what they cost in a tight loop)."""
    _plain_table(engine)
    notify = settings().notify

    def checks(conn: Connection) -> object:
        return _prepared(exchange)

    enqueue = _enqueue(exchange)

    raw = _plain_insert(engine, "outbox_message")

    def checked(conn: Connection) -> object:
        checks(conn)
        return raw(conn)

    variants: dict[str, Callable[[Connection], object]] = {
        "plain INSERT, unindexed table": _plain_insert(engine, PLAIN_TABLE),
        "the same INSERT into outbox_message": raw,
        "that INSERT after enqueue's checks": checked,
        "outbox.enqueue, NOTIFY off": enqueue,
        "its checks alone (outbox.prepared.prepare)": checks,
    }
    found: dict[str, list[float]] = {name: [] for name in variants}
    outbox.configure(notify=False)
    try:
        with engine.connect() as conn:
            for _ in range(rounds):
                for name, run in variants.items():
                    with conn.begin() as tx:
                        for _ in range(50):  # prepared on the server from the fifth run
                            run(conn)
                        started = time.perf_counter()
                        for _ in range(statements):
                            run(conn)
                        found[name].append((time.perf_counter() - started) / statements * 1e6)
                        tx.rollback()
    finally:
        outbox.configure(notify=notify)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {PLAIN_TABLE}")
    return StatementCost({name: min(us) for name, us in found.items()}, statements, rounds)


def _ratio(values: list[float], bases: list[float]) -> float:
    return statistics.median(v / b for v, b in zip(values, bases, strict=True))


def measure_many(
    engine: Engine, exchange: str, *, messages: int = MANY_MESSAGES, rounds: int = 5
) -> ManyCost:
    """`messages` messages in one transaction: one enqueue_many, and as many enqueue calls, in
    interleaved rounds (each timed from the first call to the commit)."""
    items: list[dict[str, Any]] = [
        {"exchange": exchange, "routing_key": "r", "payload": PAYLOAD} for _ in range(messages)
    ]

    def many(conn: Connection) -> object:
        return outbox.enqueue_many(conn, items)

    def calls(conn: Connection) -> object:
        for item in items:
            outbox.enqueue(conn, **item)
        return None

    def seconds(write: Callable[[Connection], object]) -> float:
        with engine.connect() as conn:
            started = time.perf_counter()
            with conn.begin():
                write(conn)
            took = time.perf_counter() - started
            with conn.begin():
                conn.exec_driver_sql("DELETE FROM outbox_message")
        return took

    many_s: list[float] = []
    calls_s: list[float] = []
    seconds(many)  # warm up
    for _ in range(rounds):
        many_s.append(seconds(many))
        calls_s.append(seconds(calls))
    return ManyCost(
        statistics.median(many_s),
        statistics.median(calls_s),
        _ratio(calls_s, many_s),
        messages,
        rounds,
    )
