"""What `outbox.enqueue` costs the application's transactions, beside baselines from the same run.

- insert-cost: one writer, one transaction at a time, each inserting a business row, and then:
  nothing (the baseline), a second plain row (what any second statement costs: a round trip),
  `outbox.enqueue` with the library's defaults (its rationed NOTIFY included), and with NOTIFY
  off. Then the same on raw asyncpg: the business row alone, a second row, `outbox.enqueue_async`
  (on SQLAlchemy's asyncpg dialect) and, when the txoutbox package is installed, txoutbox's own
  insert through its PostgreSQL adapter.
- wakeup-cost: 8 writer threads at full speed, the business row plus an outbox row, with NOTIFY
  off, rationed (the default) and on every commit; and the business row alone.

A machine's load can move by the second, so each figure is taken in rounds: every variant once per
round, in turn, and each ratio is the median over the rounds of the ratio to the same round's
baseline.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

import outbox
from outbox.config import DEFAULT_NOTIFY_BURST, DEFAULT_NOTIFY_RATE
from outbox.encoding import encode_payload

Row = tuple[str, str, str]
BUSINESS = "INSERT INTO bench_order (total) VALUES (1)"
PAYLOAD = {"order_id": 42, "status": "created"}


def _business_table(engine: Engine) -> None:
    """A fresh bench_order table, the business row's, on PostgreSQL, MySQL or MariaDB."""
    key = (
        "BIGINT AUTO_INCREMENT PRIMARY KEY"
        if engine.dialect.name in ("mysql", "mariadb")
        else "BIGSERIAL PRIMARY KEY"
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS bench_order")
        conn.exec_driver_sql(f"CREATE TABLE bench_order (id {key}, total INTEGER)")


def _defaults() -> None:
    outbox.configure(
        notify=True, notify_rate=DEFAULT_NOTIFY_RATE, notify_burst=DEFAULT_NOTIFY_BURST
    )


def _enqueue(exchange: str) -> Callable[[Connection], object]:
    return lambda c: outbox.enqueue(c, exchange=exchange, routing_key="r", payload=PAYLOAD)


def _rounds(
    variants: dict[str, Callable[[], float]], rounds: int, reset: Callable[[], None]
) -> dict[str, list[float]]:
    """Every variant once per round, in turn; commits/s per variant per round."""
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            reset()
            rates[name].append(run())
    return rates


def _rows(rates: dict[str, list[float]], base: str, label: str) -> list[Row]:
    """A row per variant: median commits/s, median ratio to `base` in the same round."""
    rows: list[Row] = []
    for name, values in rates.items():
        ratios = [v / b for v, b in zip(values, rates[base], strict=True)]
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        ratio = "1.00x" if name == base else f"{statistics.median(ratios):.2f}x{spread}"
        rows.append((f"{label}{name}", f"{statistics.median(values):,.0f} commits/s", ratio))
    return rows


def insert_cost(
    engine: Engine, url: str, exchange: str, seconds: float, reset: Callable[[], None], rounds: int
) -> list[Row]:
    """One writer: what enqueue adds to a one-row transaction, beside a second plain row."""
    _business_table(engine)

    def rate(extra: Callable[[Connection], object] | None, notify: bool = True) -> float:
        outbox.configure(notify=notify)
        done, deadline = 0, time.perf_counter() + seconds
        with engine.connect() as conn:
            started = time.perf_counter()
            while time.perf_counter() < deadline:
                with conn.begin():
                    conn.exec_driver_sql(BUSINESS)
                    if extra is not None:
                        extra(conn)
                done += 1
        _defaults()
        return done / (time.perf_counter() - started)

    variants: dict[str, Callable[[], float]] = {
        "business row only": lambda: rate(None),
        "+ a second business row": lambda: rate(lambda c: c.exec_driver_sql(BUSINESS)),
        "+ outbox.enqueue (defaults)": lambda: rate(_enqueue(exchange)),
        "+ outbox.enqueue, NOTIFY off": lambda: rate(_enqueue(exchange), notify=False),
    }
    rates = _rounds(variants, rounds, reset)
    rows = _rows(rates, "business row only", "1 writer: ")
    second = rates["+ a second business row"]
    for name in ("+ outbox.enqueue (defaults)", "+ outbox.enqueue, NOTIFY off"):
        of_second = [e / s for e, s in zip(rates[name], second, strict=True)]
        rows.append(
            (
                f"1 writer: {name[2:]} / a second row",
                f"{statistics.median(of_second):.2f}x",
                f"({min(of_second):.2f}-{max(of_second):.2f}; target >= 0.90x)",
            )
        )
    return rows + _asyncpg_cost(url, exchange, seconds, reset, rounds)


def _txoutbox_storage() -> Any | None:
    """txoutbox's PostgreSQL adapter class, if the package is installed (it is not a
    dependency of this project: the comparison runs where someone installed it)."""
    try:
        module = importlib.import_module("txoutbox.adapters.postgres")
    except ImportError:
        return None
    return module.PostgresStorage


def _asyncpg_cost(
    url: str, exchange: str, seconds: float, reset: Callable[[], None], rounds: int
) -> list[Row]:
    """The same, on asyncpg: SQLAlchemy's asyncpg dialect for enqueue_async, raw asyncpg for the
    baselines and for txoutbox (whose insert takes an asyncpg connection)."""
    import asyncpg  # type: ignore[import-untyped]

    async_url = make_url(url).set(drivername="postgresql+asyncpg")
    raw_dsn = async_url.set(drivername="postgresql").render_as_string(hide_password=False)
    storage_class = _txoutbox_storage()

    async def raw_rate(extra: Callable[[Any], Awaitable[object]] | None) -> float:
        conn = await asyncpg.connect(raw_dsn)
        try:
            done, deadline = 0, time.perf_counter() + seconds
            started = time.perf_counter()
            while time.perf_counter() < deadline:
                async with conn.transaction():
                    await conn.execute(BUSINESS)
                    if extra is not None:
                        await extra(conn)
                done += 1
            return done / (time.perf_counter() - started)
        finally:
            await conn.close()

    async def sqlalchemy_rate(
        extra: Callable[[AsyncConnection], Awaitable[object]] | None,
    ) -> float:
        engine = create_async_engine(async_url)
        try:
            async with engine.connect() as conn:
                done, deadline = 0, time.perf_counter() + seconds
                started = time.perf_counter()
                while time.perf_counter() < deadline:
                    async with conn.begin():
                        await conn.exec_driver_sql(BUSINESS)
                        if extra is not None:
                            await extra(conn)
                    done += 1
                return done / (time.perf_counter() - started)
        finally:
            await engine.dispose()

    async def enqueue_async(conn: AsyncConnection) -> object:
        return await outbox.enqueue_async(conn, exchange=exchange, routing_key="r", payload=PAYLOAD)

    async def second_business_row(conn: AsyncConnection) -> object:
        return await conn.exec_driver_sql(BUSINESS)

    async def txoutbox_rate() -> float:
        assert storage_class is not None
        pool = await asyncpg.create_pool(raw_dsn, min_size=1, max_size=1)
        try:
            storage = storage_class(pool, table="bench_txoutbox")
            await storage.create_schema()
            body = outbox_payload()

            async def insert(conn: Any) -> object:
                return await storage.insert(conn, exchange, body)

            return await raw_rate(insert)
        finally:
            await pool.close()

    async def second_row(conn: Any) -> object:
        return await conn.execute(BUSINESS)

    # Two groups, each beside its own baseline: raw asyncpg (txoutbox's ground), and SQLAlchemy's
    # asyncpg dialect (enqueue_async's), whose async layer costs something of its own.
    raw: dict[str, Callable[[], float]] = {
        "business row only": lambda: asyncio.run(raw_rate(None)),
        "+ a second business row": lambda: asyncio.run(raw_rate(second_row)),
    }
    if storage_class is not None:
        raw["+ txoutbox insert"] = lambda: asyncio.run(txoutbox_rate())
    orm: dict[str, Callable[[], float]] = {
        "business row only": lambda: asyncio.run(sqlalchemy_rate(None)),
        "+ a second business row": lambda: asyncio.run(sqlalchemy_rate(second_business_row)),
        "+ outbox.enqueue_async (defaults)": lambda: asyncio.run(sqlalchemy_rate(enqueue_async)),
    }
    groups = {"raw asyncpg: ": raw, "SQLAlchemy asyncpg: ": orm}
    measured = _rounds(
        {label + name: run for label, group in groups.items() for name, run in group.items()},
        rounds,
        reset,
    )
    rows: list[Row] = []
    for label, group in groups.items():
        rates = {name: measured[label + name] for name in group}
        rows += _rows(rates, "business row only", label)
        if group is raw and storage_class is None:
            rows.append((f"{label}+ txoutbox insert", "not measured", "txoutbox is not installed"))
    return rows


def outbox_payload() -> bytes:
    """The bytes enqueue stores for PAYLOAD, for a peer that takes bytes."""
    return encode_payload(PAYLOAD, None, 1 << 20).body


def wakeup_cost(
    engine: Engine, exchange: str, seconds: float, reset: Callable[[], None], rounds: int
) -> list[Row]:
    """8 writer threads: commits/s with NOTIFY off, rationed (the default), on every commit."""
    _business_table(engine)

    def run(with_outbox: bool, notify: bool, notify_rate: float = DEFAULT_NOTIFY_RATE) -> float:
        outbox.configure(notify=notify, notify_rate=notify_rate)
        stop = threading.Event()
        counts = [0] * 8
        enqueue = _enqueue(exchange)

        def writer(i: int) -> None:
            with engine.connect() as conn:
                while not stop.is_set():
                    with conn.begin():
                        conn.exec_driver_sql(BUSINESS)
                        if with_outbox:
                            enqueue(conn)
                    counts[i] += 1

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        _defaults()
        return sum(counts) / (time.perf_counter() - started)

    variants: dict[str, Callable[[], float]] = {
        "+ outbox row, no NOTIFY": lambda: run(True, False),
        "+ outbox row, rationed NOTIFY (default)": lambda: run(True, True),
        "+ outbox row, NOTIFY every commit": lambda: run(True, True, math.inf),
        "business row only": lambda: run(False, False),
    }
    rates = _rounds(variants, rounds, reset)
    return _rows(rates, "+ outbox row, no NOTIFY", "8 writers: ")
