"""Scale and latency figures: `python -m benchmarks.scale` (part of `make bench`).

- consumer-latency: commit-to-consumer at 100 msg/s after 3 s idle, beside RabbitMQ's own floor,
  three interleaved runs (benchmarks/latency.py).
- latency: commit-to-confirm at a steady 1,000 msg/s (LISTEN on) and at 100 msg/s with polling
  alone, with the relay idle in between. Measured in the database, on one clock:
  `published_at` (the relay's mark, written after the broker's confirm) minus `created_at` (the
  INSERT, committed right after), so each figure is an upper bound on commit-to-confirm.
- relays: the drain rate of one backlog with 1, 2 and 3 `outbox-relay run` processes.
- insert-cost, wakeup-cost: what enqueue costs a one-row transaction (beside a second plain row,
  and on asyncpg beside txoutbox's insert), and 8 writers' commits/s with NOTIFY off, rationed
  and on every commit: benchmarks/enqueue_cost.py, in interleaved rounds.
- claim-flat: one claim of 500 with 1,000 ready rows, beside no published rows and beside 1M.
- prepared-latency: commit-to-confirm at 100 msg/s without server-side prepared statements (the
  relay's default, which PgBouncer's transaction mode needs) and with them.
- observability: `/metrics` and `outbox-relay status` beside 0, 1M and 10M published rows
  (benchmarks/observability.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

import outbox
from benchmarks.drain import relay_command
from benchmarks.enqueue_cost import insert_cost, wakeup_cost
from benchmarks.fixtures import BenchDatabase, names
from benchmarks.latency import consumer_latency
from benchmarks.observability import observability
from relay.store.sql_store import open_store

ADMIN_URL = os.environ.get("BENCH_DB_URL", "postgresql+psycopg://root@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
EXCHANGE = f"bench.scale.{os.getpid()}"
Row = tuple[str, str, str]


def _broker(action: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    if action == "create":
        ch.exchange_declare(EXCHANGE, "topic", durable=True)
        ch.queue_declare(EXCHANGE, durable=True)
        ch.queue_bind(EXCHANGE, EXCHANGE, "#")
    elif action == "purge":
        ch.queue_purge(EXCHANGE)
    else:
        ch.queue_delete(EXCHANGE)
        ch.exchange_delete(EXCHANGE)
    conn.close()


def _relay(url: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *relay_command(),
            "--db",
            url,
            "--amqp",
            AMQP_URL,
            "--log-level",
            "warning",
            "run",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)


def _reset(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE outbox_message, outbox_attempt")
    _broker("purge")


def _wait_published(engine: Engine, total: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            done = conn.execute(
                text("SELECT count(*) FROM outbox_message WHERE state = 'published'")
            ).scalar_one()
        if done >= total:
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out: {done}/{total} published")


def latency(
    engine: Engine, url: str, rate: int, seconds: float, listen: bool, note: str = ""
) -> Row:
    _reset(engine)
    relay = _relay(url, "--listen" if listen else "--no-listen")
    time.sleep(2.0)  # started and idle
    total = int(rate * seconds)
    start = time.perf_counter()
    with engine.connect() as conn:
        for n in range(total):
            due = start + n / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            with conn.begin():
                outbox.enqueue(conn, exchange=EXCHANGE, routing_key="r", payload={"n": n})
    _wait_published(engine, total, 60)
    _stop([relay])
    with engine.connect() as conn:
        p50, p99 = conn.execute(
            text(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d),"
                " percentile_cont(0.99) WITHIN GROUP (ORDER BY d) FROM ("
                " SELECT EXTRACT(EPOCH FROM published_at - created_at) * 1000 AS d"
                " FROM outbox_message) AS x"
            )
        ).one()
    how = ("LISTEN + adaptive polling" if listen else "adaptive polling only") + note
    return (
        f"commit-to-confirm at {rate:,} msg/s ({how})",
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
        "target p50 < 5, p99 < 25" if rate == 1000 and listen else "",
    )


def _prepared(url: str) -> str:
    """`url` with psycopg's server-side prepared statements on (its own default)."""
    return make_url(url).update_query_dict({"prepare_threshold": "5"}).render_as_string(False)


def prepared_latency(engine: Engine, url: str, seconds: float) -> list[Row]:
    """Latency at 100 msg/s without server-side prepared statements (the relay's default, for
    PgBouncer) and with them (psycopg's default): at one message per claim, each claim and mark
    is planned again without them, which batches of hundreds hide."""
    on = make_url(url).update_query_dict({"prepare_threshold": "5"})
    return [
        latency(engine, url, 100, seconds, True, ", no prepared statements"),
        latency(engine, on.render_as_string(False), 100, seconds, True, ", prepared statements"),
    ]


def _load(engine: Engine, total: int) -> None:
    body = {"pad": "x" * 1000}
    for start in range(0, total, 5000):
        with engine.begin() as conn:
            for _ in range(min(5000, total - start)):
                outbox.enqueue(conn, exchange=EXCHANGE, routing_key="r", payload=body)


def relays(engine: Engine, url: str, total: int) -> list[Row]:
    rows: list[Row] = []
    one = 0.0
    for count in (1, 2, 3):
        _reset(engine)
        _load(engine, total)
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE outbox_message")
        start = time.perf_counter()
        procs = [_relay(url, "--relay-id", f"bench-{i}") for i in range(count)]
        _wait_published(engine, total, 300)
        rate = total / (time.perf_counter() - start)
        _stop(procs)
        one = one or rate
        rows.append((f"drain, {count} relay(s)", f"{rate:,.0f} msg/s", f"{rate / one:.2f}x one"))
    return rows


def claim_flat(engine: Engine, url: str, published: int) -> list[Row]:
    def ms_per_claim() -> float:
        store = open_store(url)
        times = []
        for _ in range(20):
            token = uuid.uuid4()
            t = time.perf_counter()
            rows = store.claim(owner="bench", token=token, limit=500, lease_seconds=30)
            times.append((time.perf_counter() - t) * 1000)
            store.release(token, [r.seq for r in rows], delay_seconds=0, error="bench")
        store.close()
        return statistics.median(times)

    _reset(engine)
    _load(engine, 1000)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox_message")
    empty = ms_per_claim()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, state,"
            " attempts, available_at, created_at, published_at)"
            " SELECT gen_random_uuid(), 'e', 'r', '\\x7b7d'::bytea, 'application/json',"
            " 'published', 1, now() - interval '1 day', now() - interval '1 day',"
            f" now() - interval '1 day' FROM generate_series(1, {int(published)})"
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox_message")
    full = ms_per_claim()
    return [
        ("claim 500 of 1,000 ready, 0 published rows", f"{empty:.2f} ms", "1.00x"),
        (
            f"claim 500 of 1,000 ready, {published:,} published rows",
            f"{full:.2f} ms",
            f"{full / empty:.2f}x",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller, shorter phases")
    parser.add_argument(
        "--phases",
        default="consumer-latency,latency,relays,insert-cost,wakeup-cost,claim-flat,prepared-latency,observability",
        help="comma-separated",
    )
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    seconds = 3.0 if args.quick else 10.0
    backlog = 10_000 if args.quick else 50_000
    published = 100_000 if args.quick else 1_000_000
    beside = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)

    db = BenchDatabase(ADMIN_URL, names() + "_scale")
    db.create()
    engine = create_engine(db.url, pool_size=10, max_overflow=2)  # 8 writers at once
    outbox.create_schema(engine)
    _broker("create")
    rows: list[Row] = []
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("consumer-latency", lambda: rows.extend(consumer_latency(
            engine, AMQP_URL, EXCHANGE, EXCHANGE, {
                "relay defaults": lambda: _relay(db.url),
                "prepared statements": lambda: _relay(_prepared(db.url)),
            }, seconds=seconds / 2,
        ))),
        ("latency", lambda: rows.extend([
            latency(engine, db.url, 1000, seconds, True),
            latency(engine, db.url, 100, seconds, False),
        ])),
        ("relays", lambda: rows.extend(relays(engine, db.url, backlog))),
        ("insert-cost", lambda: rows.extend(
            insert_cost(engine, db.url, EXCHANGE, seconds / 3, lambda: _reset(engine), rounds=3)
        )),
        ("wakeup-cost", lambda: rows.extend(
            wakeup_cost(engine, EXCHANGE, seconds / 3, lambda: _reset(engine), rounds=3)
        )),
        ("claim-flat", lambda: rows.extend(claim_flat(engine, db.url, published))),
        ("prepared-latency", lambda: rows.extend(prepared_latency(engine, db.url, seconds))),
        ("observability", lambda: rows.extend(observability(engine, db.url, AMQP_URL, beside))),
    ]  # fmt: skip
    try:
        for name, step in steps:
            if name in phases:
                print(f"{name} ...", flush=True)
                step()
    finally:
        engine.dispose()
        _broker("delete")
        db.drop()
    width = max(len(r[0]) for r in rows) if rows else 10
    print()
    shown = " ".join(["python -m benchmarks.scale", *(argv if argv is not None else sys.argv[1:])])
    print(f"command : {shown}")
    print(f"machine : {os.cpu_count()} cores; PostgreSQL and RabbitMQ on loopback")
    for figure, value, ratio in rows:
        print(f"{figure:<{width}}  {value:>28}  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
