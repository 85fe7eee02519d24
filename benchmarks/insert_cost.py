"""What `outbox.enqueue` costs a one-row transaction, on whichever database `--db` names: one
writer, one transaction at a time, each inserting a business row, with and without an outbox row.

A machine's load can move by the second, so the two run in interleaved rounds and the cost is the
median over the rounds of each round's ratio. (benchmarks/enqueue_cost.py has the fuller PostgreSQL
comparison: a second plain row, NOTIFY, asyncpg, txoutbox.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine

import outbox

PAYLOAD = {"order_id": 42, "status": "created"}


@dataclass(frozen=True, slots=True)
class InsertCost:
    alone: float  # commits/s, business row only (median over rounds)
    with_outbox: float  # commits/s, business row + outbox.enqueue
    ratio: float  # median over rounds of with_outbox / alone
    rounds: int

    def describe(self) -> str:
        return (
            f"one writer: business row alone {self.alone:,.0f} commits/s, with outbox.enqueue "
            f"{self.with_outbox:,.0f} commits/s = {self.ratio:.2f}x "
            f"(median of {self.rounds} interleaved rounds)"
        )


def _business_table(engine: Engine) -> None:
    key = (
        "BIGINT AUTO_INCREMENT PRIMARY KEY"
        if engine.dialect.name in ("mysql", "mariadb")
        else "BIGSERIAL PRIMARY KEY"
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS bench_order")
        conn.exec_driver_sql(f"CREATE TABLE bench_order (id {key}, total INTEGER)")


def _rate(engine: Engine, seconds: float, extra: Callable[[Connection], object] | None) -> float:
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    with engine.connect() as conn:
        while time.perf_counter() < deadline:
            with conn.begin():
                conn.exec_driver_sql("INSERT INTO bench_order (total) VALUES (1)")
                if extra is not None:
                    extra(conn)
            done += 1
    return done / (time.perf_counter() - started)


def measure_insert_cost(
    engine: Engine, exchange: str, *, rounds: int = 5, seconds: float = 2.0
) -> InsertCost:
    """Interleaved rounds of the two kinds of transaction on `engine` (the outbox schema made)."""
    _business_table(engine)

    def enqueue(conn: Connection) -> object:
        return outbox.enqueue(conn, exchange=exchange, routing_key="r", payload=PAYLOAD)

    alone: list[float] = []
    with_outbox: list[float] = []
    try:
        _rate(engine, 0.5, enqueue)  # warm up: connections, statement caches
        for _ in range(rounds):
            alone.append(_rate(engine, seconds, None))
            with_outbox.append(_rate(engine, seconds, enqueue))
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS bench_order")
            conn.exec_driver_sql("DELETE FROM outbox_message")
    ratios = [b / a for a, b in zip(alone, with_outbox, strict=True)]
    return InsertCost(
        statistics.median(alone), statistics.median(with_outbox), statistics.median(ratios), rounds
    )
