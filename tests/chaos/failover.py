"""The PostgreSQL failover fault: a primary with a streaming standby (tests/faults/pg_standby.py),
writers and a relay with default settings on a multi-host URL, the primary SIGKILLed (every
process of it) while the relay drains, the standby promoted DOWN seconds later.

What the table's counts mean here. The writers only count a message committed once the promoted
standby has its row: a commit whose answer the crash lost is looked up there (as an application
retrying would) and counted as committed or rolled back by what it finds. The rows the new primary
does not have are what the replication lost, not the relay: with asynchronous replication a
commit the old primary acknowledged may never have reached the standby. So:

- phantom: reached the consumer, and the promoted standby has no row for it (published from the
  old primary before its commit was replicated);
- lost with the primary: acknowledged to its writer, missing on the promoted standby, never
  published. Neither is counted in the table's lost or unexpected, which are the relay's.

Measured from the moment the promotion returned: the first arrival of a message committed after it
(the relay publishes again), and the last first arrival of the rows in flight at the crash (leased
then, as the standby has them: taken back when the relay comes back, or when their lease runs out).
While the database is down the run also scrapes the relay's /metrics and /readyz.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

import outbox
from tests.chaos.checker import DeliveryChecker
from tests.chaos.mid_drain import write_backlog
from tests.chaos.run import AMQP_URL, Consumer, Relay, Row, topology
from tests.faults.pg_standby import Pair
from tests.support.ports import free_port

# No comma in them: --only splits its prefixes at commas.
NAMES = {
    (True, False): "postgresql failover (sync replication): primary SIGKILL and standby promoted",
    (False, False): "postgresql failover (async replication): primary SIGKILL and standby promoted",
    (True, True): "postgresql failover (sync replication; writers idle): primary SIGKILL and "
    "standby promoted",
    (False, True): "postgresql failover (async replication; writers idle): primary SIGKILL and "
    "standby promoted",
}


@dataclass(frozen=True)
class Failover:
    """What the table's columns do not say about a failover run."""

    phantoms: int
    lost_with_primary: int
    in_flight_at_crash: int
    publishing_again_s: float | None  # first arrival of a message committed after the promotion
    last_leased_s: float | None  # last first arrival of the rows in flight at the crash
    expired: int  # relay.leases_reclaimed lines: leases taken back only when they ran out
    scrapes: int  # /metrics scrapes while the database was down
    metrics_lines: int  # metrics.database_unavailable lines in the relay's log
    tracebacks: int  # "Traceback" in the relay's log
    readyz_down: str  # what /readyz said while the database was down
    strays: str  # relay.strays_reclaimed: how many rows each took back, when
    connected: str  # the relay's database.connected lines, host and when (s from promotion)


class Writers:
    """Threads committing one keyed message per transaction at `rate` in all, each key owned by
    one of them. A commit that fails is resolved against the database once it answers again (a
    multi-host URL reaches the promoted standby): committed if the row is there."""

    def __init__(
        self, engine: Engine, exchange: str, checker: DeliveryChecker, *, total: int,
        rate: float, writers: int = 4, keys: int = 200,
    ) -> None:  # fmt: skip
        self.engine, self.exchange, self.checker = engine, exchange, checker
        self.count, self.pause = total // writers, writers / rate
        self.keys = [[f"k{k}" for k in range(keys) if k % writers == w] for w in range(writers)]
        self.acked: dict[str, float] = {}  # id -> when its commit returned (monotonic)
        self.failed = 0  # transactions that raised
        self._threads = [threading.Thread(target=self._write, args=(w,), daemon=True)
                         for w in range(writers)]  # fmt: skip

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        for t in self._threads:
            t.join()

    def _write(self, w: int) -> None:
        next_at = time.monotonic()
        for n in range(self.count):
            next_at = max(next_at + self.pause, time.monotonic() - 1.0)
            time.sleep(max(0.0, next_at - time.monotonic()))
            key = self.keys[w][n % len(self.keys[w])]
            message_id: str | None = None
            try:
                with Session(self.engine) as session, session.begin():
                    message_id = str(outbox.enqueue(
                        session, exchange=self.exchange, routing_key="chaos",
                        payload={"n": n, "w": w}, key=key,
                    ))  # fmt: skip
                self.acked[message_id] = time.monotonic()
                self.checker.committed(message_id, key)
            except SQLAlchemyError:
                self.failed += 1
                if message_id is not None and self._exists(message_id):
                    self.checker.committed(message_id, key)
                elif message_id is not None:
                    self.checker.rolled_back(message_id)

    def _exists(self, message_id: str) -> bool:
        while True:
            try:
                with self.engine.connect() as conn:
                    found = conn.execute(
                        text("SELECT count(*) FROM outbox_message WHERE id = :id"),
                        {"id": uuid.UUID(message_id)},
                    )
                    return bool(found.scalar_one())
            except SQLAlchemyError:
                time.sleep(0.1)  # no writable primary yet


def _ids(engine: Engine, where: str = "") -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT id FROM outbox_message {where}"))
        return {str(r[0]) for r in rows}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


@contextlib.contextmanager
def _environment(pair: Pair) -> Iterator[tuple[str, Engine, str, str]]:
    """A schema on the pair (migrated), an exchange and a queue; the queue and exchange removed
    afterwards (the clusters go with `pair.down()`)."""
    suffix = uuid.uuid4().hex[:10]
    schema, exchange, queue = f"chaos_{suffix}", f"chaos.{suffix}", f"chaos.{suffix}.q"
    admin = create_engine(pair.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    url = f"{pair.url()}&options={urllib.parse.quote(f'-csearch_path={schema}')}"
    engine = create_engine(url, pool_size=8, pool_pre_ping=True)
    outbox.create_schema(engine)
    try:
        with topology(exchange, {"#": queue}):
            yield url, engine, exchange, queue
    finally:
        engine.dispose()


def run_failover(
    *, synchronous: bool, idle: bool = False, backlog: int = 20_000, messages: int = 20_000,
    rate: float = 1000.0, crash_at: float = 0.4, down: float = 1.0, settle_timeout: float = 120.0,
    workdir: Path | None = None,
) -> tuple[Row, Failover]:  # fmt: skip
    """One failover run: the pair made, the fault, the pair removed. `backlog` messages are
    committed before the relay starts (every 10th keyed), the writers commit `messages` more at
    `rate` from its start, and the primary is killed once `crash_at` of the backlog has
    arrived: mid-drain, the relay holding full batches in flight. With `idle` the writers start
    only once the standby is promoted: nothing but the relay writes when the primary dies, so
    nothing flushes the relay's asynchronous commits (its claims and marks, Dialect.relaxed_commit)
    before the WAL writer does, and the last of them never reach the standby."""
    name = NAMES[synchronous, idle]
    workdir = workdir or Path(os.environ.get("TMPDIR", "/tmp"))
    pair = Pair()
    pair.up(synchronous=synchronous)
    try:
        return _run(pair, name, synchronous, idle, backlog, messages, rate, crash_at, down,
                    settle_timeout, workdir)  # fmt: skip
    finally:
        pair.down()


def _run(
    pair: Pair, name: str, synchronous: bool, idle: bool, backlog: int, messages: int, rate: float,
    crash_at: float, down: float, settle_timeout: float, workdir: Path,
) -> tuple[Row, Failover]:  # fmt: skip
    checker = DeliveryChecker()
    with _environment(pair) as (db_url, engine, exchange, queue):
        port = free_port()
        log = (
            workdir
            / f"chaos-failover-{'sync' if synchronous else 'async'}-{uuid.uuid4().hex[:6]}.log"
        )
        relay = Relay(db_url, AMQP_URL, log, flags=("--http-port", str(port)))  # defaults else
        consumer = Consumer(queue, checker)
        writers = Writers(engine, exchange, checker, total=messages, rate=rate)
        write_backlog(engine, exchange, checker, messages=backlog, keyed_every=10, keys=200)
        consumer.start()
        relay.start()
        if not idle:
            writers.start()
        scrapes, readyz = 0, ""
        try:
            deadline = time.monotonic() + settle_timeout
            while checker.received_count < crash_at * backlog:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: the relay did not get going: see {log}")
                time.sleep(0.005)
            leased = _ids(engine, "WHERE state = 'in_flight'")  # a moment before the crash
            pair.kill_primary()
            crashed_at = time.monotonic()
            while time.monotonic() - crashed_at < down:  # the orchestrator's detection time
                _get(f"http://127.0.0.1:{port}/metrics")
                scrapes += 1
                if not readyz:
                    status, body = _get(f"http://127.0.0.1:{port}/readyz")
                    readyz = f"{status} {body.strip()}"
                time.sleep(0.2)
            pair.promote()
            promoted, promoted_wall = time.monotonic(), time.time()
            if idle:
                writers.start()
            leased |= _ids(engine, "WHERE state = 'in_flight'")  # as the standby has them
            writers.join()
            present = _ids(engine)
            deadline = promoted + settle_timeout
            while not checker.all_received(checker.committed_ids() & present):
                if time.monotonic() > deadline:
                    break
                relay.ensure_running()
                time.sleep(0.1)
            time.sleep(0.5)  # a late duplicate would show up now
        finally:
            relay.stop()
            consumer.stop()
    committed = checker.committed_ids()
    received = checker.received_ids()
    phantoms = received - present
    lost_with_primary = (committed - present) - received
    report = checker.report()
    unexpected_phantoms = len(phantoms - committed)
    report = replace(
        report,
        lost=report.lost - len(lost_with_primary),
        unexpected=report.unexpected - unexpected_phantoms,
        lost_ids=tuple(i for i in report.lost_ids if i not in lost_with_primary),
    )
    held_back = {i for i in committed & present if writers.acked.get(i, 0.0) <= promoted}
    arrivals = checker.arrival_times(held_back)
    recovery = max(arrivals) - promoted if arrivals else 0.0
    after = {i for i, at in writers.acked.items() if at > promoted}
    first_after = checker.arrival_times(after)
    leased_arrivals = checker.arrival_times(leased & present)
    text_log = log.read_text(errors="replace")
    connected = ", ".join(
        f"{m[2]} at {_stamp(m[1]) - promoted_wall:+.1f} s"
        for m in re.finditer(r"^(\S+Z) \w+ database\.connected db=\S+ host=(\S+)", text_log, re.M)
    )
    note = Failover(
        phantoms=len(phantoms),
        lost_with_primary=len(lost_with_primary),
        in_flight_at_crash=len(leased),
        publishing_again_s=min(first_after) - promoted if first_after else None,
        last_leased_s=max(leased_arrivals) - promoted if leased_arrivals else None,
        expired=text_log.count("relay.leases_reclaimed"),
        scrapes=scrapes,
        metrics_lines=text_log.count("metrics.database_unavailable"),
        tracebacks=text_log.count("Traceback"),
        readyz_down=readyz[:200],
        connected=connected or "none",
        strays=", ".join(
            f"{m[2]} at {_stamp(m[1]) - promoted_wall:+.1f} s"
            for m in re.finditer(r"^(\S+Z) \w+ relay\.strays_reclaimed count=(\d+)", text_log, re.M)
        )
        or "none",
    )
    return Row(name, report, recovery), note


def _stamp(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f} s"


def note(row: Row, f: Failover) -> str:
    return (
        f"{row.fault}: {f.phantoms} phantom (published, no row on the promoted standby), "
        f"{f.lost_with_primary} lost with the primary (acknowledged, never replicated); from the "
        f"promotion: publishing again {_s(f.publishing_again_s)}, the last of the "
        f"{f.in_flight_at_crash} rows in flight at the crash arrived {_s(f.last_leased_s)} "
        f"(strays reclaimed: {f.strays}; leases that ran out: {f.expired}); "
        f"database.connected: {f.connected}; while down: {f.scrapes} /metrics scrapes, "
        f"{f.metrics_lines} metrics.database_unavailable line(s), {f.tracebacks} tracebacks in "
        f"the log, /readyz {f.readyz_down}"
    )
