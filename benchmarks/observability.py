"""What `/metrics` and `outbox-relay status` cost beside many published rows (the scale phase
`observability`: `python -m benchmarks.scale --phases observability`).

One run, one database. The outbox measured holds a small backlog and some failures (pending and
delayed, in flight under a lease that outlasts the run, dead, discarded: nothing for the relay to
send), then published rows written straight in (INSERT ... SELECT generate_series: millions a
minute) up to each size, each followed by VACUUM ANALYZE, as autovacuum would (explicitly, so the
figures do not depend on when autovacuum runs), and a checkpoint. Beside it, in a schema of its
own, the baseline: the same backlog and failures without a published row. At each size, each
figure is taken on both, alternately, so the machine's load, whatever else runs on it, weighs on
both alike:

- `/metrics` of an `outbox-relay run --http-port` on each: each scrape reads the state gauges from
  the database (scrapes are spaced past the gauges' half-second cache);
- `outbox-relay status` as a process, as an operator runs it;
- `SqlStore.counts()` in this process: the database's share of both;
- and, for comparison, a plain count that reads the whole table:
  `SELECT state, count(*) ... GROUP BY state`.

Medians; targets: `/metrics` <= 50 ms, status <= 1.3x its time beside no published row.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

import outbox
from benchmarks.drain import relay_command
from relay.store.sql_store import open_store

Row = tuple[str, str, str]

ROUNDS = 9  # measurements of each figure on each outbox, alternately
SCRAPE_GAP = 0.6  # seconds: past the gauges' cache of one reading (relay/loop/observer.py)

# Published rows with ids of a past moment, numbered from :first (UUIDv7-shaped and in order, so
# the id index is only appended to), due, enqueued and published an hour ago: outside retention.
_PUBLISHED = """
INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, state, attempts,
    available_at, created_at, published_at)
SELECT ('018f0000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
    'bench.observability.' || mod(g, 3), 'r', '\\x7b7d'::bytea, 'application/json', 'published',
    1, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(%(first)s, %(last)s) AS g
"""

# The backlog and the failures status and the gauges count exactly (none of it due to be sent).
_OTHERS = """
INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, state, attempts,
    available_at, created_at, lease_owner, lease_token, lease_expires_at, last_error,
    last_failed_at)
SELECT gen_random_uuid(), 'bench.observability.' || mod(g, 3), 'r', '\\x7b7d'::bytea,
    'application/json', s.state, 1, now() + interval '1 day', now(),
    CASE WHEN s.state = 'in_flight' THEN 'bench' END,
    CASE WHEN s.state = 'in_flight' THEN gen_random_uuid() END,
    CASE WHEN s.state = 'in_flight' THEN now() + interval '1 day' END,
    CASE WHEN s.state IN ('dead', 'discarded') THEN 'bench' END,
    CASE WHEN s.state IN ('dead', 'discarded') THEN now() END
FROM (VALUES ('pending', 1000), ('in_flight', 200), ('dead', 50), ('discarded', 50))
    AS s(state, n), generate_series(1, s.n) AS g
"""


class Outbox:
    """One outbox measured: its URL, a relay serving its /metrics, a store reading its counts."""

    def __init__(self, url: str, amqp_url: str) -> None:
        self.url = url
        port = _free_port()
        self.metrics = f"http://127.0.0.1:{port}/metrics"
        self.relay = subprocess.Popen(
            [*relay_command(), "--db", url, "--amqp", amqp_url, "--log-level", "warning",
             "run", "--http-port", str(port), "--http-host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.store = open_store(url)
        try:
            _until_up(f"http://127.0.0.1:{port}/healthz", self.relay)
        except BaseException:
            self.close()
            raise

    def scrape(self) -> None:
        with urllib.request.urlopen(self.metrics, timeout=30) as response:
            if b"outbox_messages{" not in response.read():
                raise RuntimeError(f"no state gauges at {self.metrics}")

    def status(self) -> None:
        subprocess.run([*relay_command(), "--db", self.url, "status"], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)  # fmt: skip

    def close(self) -> None:
        self.store.close()
        self.relay.terminate()
        self.relay.wait(60)


def observability(engine: Engine, url: str, amqp_url: str, sizes: tuple[int, ...]) -> list[Row]:
    """The figures at 0 published rows and at each of `sizes` (ascending), each beside the same
    figure taken at the same moments on the baseline (the same outbox without published rows)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE outbox_message, outbox_attempt")
    measured: list[tuple[int, dict[str, tuple[float, float]]]] = []
    with _twin(url) as twin_url, contextlib.ExitStack() as stack:
        for each in (url, twin_url):
            backlog = create_engine(each, pool_size=1)
            with backlog.begin() as conn:
                conn.exec_driver_sql(_OTHERS)
            _vacuum(backlog)
            backlog.dispose()
        full = Outbox(url, amqp_url)
        stack.callback(full.close)
        base = Outbox(twin_url, amqp_url)
        stack.callback(base.close)
        have = 0
        for size in (0, *sizes):
            if size > have:
                print(f"  writing {size - have:,} published rows ...", flush=True)
                with engine.begin() as conn:
                    conn.exec_driver_sql(_PUBLISHED, {"first": have + 1, "last": size})
                _vacuum(engine)
                have = size
            figures = {
                "scrape": _pair(full.scrape, base.scrape, gap=SCRAPE_GAP),
                "status": _pair(full.status, base.status),
                "counts": _pair(full.store.counts, base.store.counts),
                "before": (_median(lambda: _old_count(engine)), 0.0),
            }
            measured.append((size, figures))
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE outbox_message, outbox_attempt")
    return _rows(measured)


def _rows(measured: list[tuple[int, dict[str, tuple[float, float]]]]) -> list[Row]:
    rows: list[Row] = []
    what = {
        "scrape": ("/metrics", " (target <= 50 ms)"),
        "status": ("status", " (target <= 1.3x)"),
        "counts": ("  of which counting", ""),
    }
    for key, (name, target) in what.items():
        for size, figures in measured:
            full, base = figures[key]
            rows.append((f"{name}, {size:,} published",
                         f"{full * 1000:,.1f} ms",
                         f"{full / base:.2f}x of {base * 1000:,.1f} ms beside none"
                         + (target if size else "")))  # fmt: skip
    for size, figures in measured[1:]:
        before = figures["before"][0] * 1000
        rows.append((f"  before: GROUP BY state, {size:,} published",
                     f"{before:,.0f} ms", ""))  # fmt: skip
    return rows


@contextlib.contextmanager
def _twin(url: str) -> Iterator[str]:
    """An outbox in a schema of its own in the same database; dropped afterwards."""
    schema = f"bench_baseline_{os.getpid()}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    twin = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    twin_url = twin.render_as_string(hide_password=False)
    engine = create_engine(twin_url, pool_size=1)
    try:
        outbox.create_schema(engine)
        engine.dispose()
        yield twin_url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


def _vacuum(engine: Engine) -> None:
    # The statistics of the rows just written are reported before VACUUM counts them (a report
    # arriving after it would be added to what it found); then what autovacuum would do; then a
    # checkpoint, so that writing out millions of new rows is not measured along with the rest.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")
        conn.exec_driver_sql("VACUUM ANALYZE outbox_message")
        conn.exec_driver_sql("CHECKPOINT")


def _pair(
    full: Callable[[], Any], empty: Callable[[], Any], gap: float = 0.0
) -> tuple[float, float]:
    """Medians of `full` and `empty`, run alternately ROUNDS times each (after one warm-up)."""
    full()
    empty()
    took: tuple[list[float], list[float]] = ([], [])
    for _ in range(ROUNDS):
        for run, into in ((full, took[0]), (empty, took[1])):
            time.sleep(gap)
            started = time.perf_counter()
            run()
            into.append(time.perf_counter() - started)
    return statistics.median(took[0]), statistics.median(took[1])


def _median(run: Callable[[], Any], times: int = 3) -> float:
    took = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def _old_count(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT state, count(*) FROM outbox_message GROUP BY state").all()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until_up(url: str, relay: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if relay.poll() is not None:
            raise RuntimeError(f"the relay exited with {relay.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the relay did not answer {url} within {timeout:g} s")
