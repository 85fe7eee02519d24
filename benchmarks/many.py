"""The `many` phase: one relay serving many databases (`outbox-relay run --db-file FILE`) against
one relay serving one, on the same messages, in the same run.

- The same TOTAL messages (the run's backlog, MANY_ROWS at most), once in one database drained by
  `outbox-relay --db URL run` (drain.drain_subprocess: the subprocess phase's measurement), and
  once split evenly (by seq, round robin) over N PostgreSQL schemas of the bench database, each a
  database of its own to the relay (`NAME = URL` lines, the URL's search_path naming its schema),
  drained by one `outbox-relay --db-file FILE run`: one loop thread and up to PER_DATABASE
  connections per database (the drain's details count them), one broker connection shared, a
  lane of channels per database. Both timed the same
  way: from the (first) `relay.started` line to the moment no row is pending or in flight; the
  relay's CPU per message and its peak RSS as the subprocess phase reports them. Both are shown
  against the run's raw pika ceiling (measured here, on the same messages, if the run has none).
- Fairness, with the same relay still running, every database empty: a trickle of TRICKLE_RATE
  msg/s committed round robin into the N-1 other databases (outbox.enqueue, one message a
  transaction, a routing key of its own to a queue of the phase's own, read by a consumer in
  this process), its commit-to-consumer latency with the first database idle; then the first
  draining a backlog of the same TOTAL messages (committed at once, its loop woken by NOTIFY),
  alone, and again beside the trickle: both drains' rates (timed from the backlog's commit to
  its last row published; the relay's CPU per message of the backlog, the trickle's work
  included beside it), and the trickle's p50 during the second over its p50 idle.

The schemas and the queue are removed at the end of the phase.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika
from sqlalchemy import Connection, Engine, create_engine, text

import outbox
from benchmarks import bounds
from benchmarks.drain import (
    DB_POLL,
    DrainResult,
    _peak_rss,
    drain_subprocess,
    relay_command,
)
from benchmarks.fixtures import BenchBroker, BenchDatabase
from benchmarks.latency import Consumer, percentiles
from benchmarks.machine import CpuMeter
from benchmarks.results import FIGURES, Results, add, add_drain, say, settle
from outbox.enqueue import NOTIFY_CHANNEL
from outbox.schema import message

MANY_ROWS = 50_000  # messages each drain takes, at most (--messages when fewer)
DATABASES = 10  # the default of --many-databases
TRICKLE_RATE = 50.0  # msg/s into the other databases, all of them together
TRICKLE_IDLE = 4.0  # seconds of trickle with every database idle
TRICKLE_LEAD = 1.0  # seconds of trickle before the backlog is committed (not counted)
TRICKLE_KEY = "many.trickle"  # its routing key: bound to the phase's own queue only
START_TIMEOUT = 60.0  # seconds for the relay to start serving every database
PER_DATABASE = 4  # connections the relay opens per database, at most (its store's, LISTEN)
_LEVEL = re.compile(r"^\S+ (warning|error) (\S+)")
# Warnings every relay logs here, one per database, whatever it serves: the bench server runs
# with autovacuum off (each phase vacuums what it drains).
_EXPECTED = frozenset({"schema.autovacuum_off"})
_CONNECTIONS = (
    "SELECT count(*), count(*) FILTER (WHERE application_name = 'outbox-relay')"
    " FROM pg_stat_activity"
    " WHERE datname = current_database() AND backend_type = 'client backend'"
)
_ROOM = (
    "SELECT current_setting('max_connections')::int"
    " - current_setting('superuser_reserved_connections')::int - count(*)"
    " FROM pg_stat_activity WHERE backend_type = 'client backend'"
)


class ManyError(RuntimeError):
    """The many-databases relay failed, or left rows unpublished."""


# --------------------------------------------------------------------------- the databases


@dataclass
class Schemas:
    """N schemas of the bench database, each with the outbox tables: N databases to a relay."""

    db: BenchDatabase
    count: int
    names: list[str] = field(default_factory=list)
    _engine: Engine | None = None

    def __post_init__(self) -> None:
        self.names = [f"many_{i:02d}" for i in range(self.count)]

    def url(self, schema: str) -> str:
        options = urllib.parse.quote(f"-csearch_path={schema}", safe="")
        return f"{self.db.url}?options={options}"

    @property
    def engine(self) -> Engine:
        if self._engine is None:  # two connections: progress, and the trickle's commits
            self._engine = create_engine(self.db.url, pool_size=2, max_overflow=0)
        return self._engine

    def create(self) -> None:
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for name in self.names:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
                conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        for name in self.names:  # as an application's migration would, through its own URL
            engine = create_engine(self.url(name), pool_size=1)
            try:
                outbox.create_schema(engine)
            finally:
                engine.dispose()

    def db_file(self, directory: Path) -> Path:
        path = directory / "databases"
        path.write_text("".join(f"{name} = {self.url(name)}\n" for name in self.names))
        return path

    def fill(self, total: int) -> None:
        """The backlog's first `total` rows split round robin by seq over the schemas, each
        table then vacuumed and analyzed, as db.restore() leaves the one database."""
        first = f"SELECT * FROM public.bench_backlog ORDER BY seq LIMIT {total}"
        with self.engine.begin() as conn:
            for i, name in enumerate(self.names):
                table = f'"{name}".outbox_message'
                conn.exec_driver_sql(f"TRUNCATE {table}")
                conn.exec_driver_sql(
                    f"INSERT INTO {table} SELECT * FROM ({first}) b "
                    f"WHERE mod(b.seq, {self.count}) = {i}"
                )
                # The rows came with their seqs: the identity moves past them.
                conn.exec_driver_sql(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'seq'), "
                    "(SELECT max(seq) FROM public.bench_backlog))"
                )
        self.vacuum(self.names)

    def vacuum(self, names: list[str]) -> None:
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for name in names:
                conn.exec_driver_sql(f'VACUUM ANALYZE "{name}".outbox_message')
            with contextlib.suppress(Exception):
                conn.exec_driver_sql("CHECKPOINT")

    def clear(self, name: str) -> None:
        """No row left in `name`, none dead: ready for pour()."""
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f'DELETE FROM "{name}".outbox_message')
        self.vacuum([name])

    def pour(self, total: int, name: str) -> float:
        """The backlog's first `total` rows into `name` under new seqs, analyzed, its relay woken
        by NOTIFY, in one transaction; the moment its commit returned."""
        first = f"SELECT * FROM public.bench_backlog ORDER BY seq LIMIT {total}"
        columns = ", ".join(c.name for c in message.columns if c.name != "seq")
        table = f'"{name}".outbox_message'
        with self.engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO {table} ({columns}) SELECT {columns} FROM ({first}) b"
            )
            conn.exec_driver_sql(f"ANALYZE {table}")
            conn.execute(text("SELECT pg_notify(:channel, '')"), {"channel": NOTIFY_CHANNEL})
        return time.perf_counter()

    def remaining(self, conn: Connection, names: list[str] | None = None) -> bool:
        """True while any row of `names` (every schema) is pending or in flight."""
        probes = " OR ".join(
            f"EXISTS (SELECT 1 FROM \"{name}\".outbox_message WHERE state = '{state}')"
            for name in names or self.names
            for state in ("pending", "in_flight")
        )
        return bool(conn.exec_driver_sql(f"SELECT {probes}").scalar())

    def connections(self, conn: Connection) -> tuple[int, int]:
        """Client connections to the bench database now, `conn` among them: all, and the
        relay's stores' (by their application_name)."""
        every, stores = conn.exec_driver_sql(_CONNECTIONS).one()
        return int(every), int(stores)

    def room(self) -> int:
        """Client connections the server would still take from anyone but a superuser."""
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql(_ROOM).scalar_one())

    def by_state(self) -> dict[str, int]:
        union = " UNION ALL ".join(
            f'SELECT state FROM "{name}".outbox_message' for name in self.names
        )
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(f"SELECT state, count(*) FROM ({union}) s GROUP BY state")
            return {str(state): int(n) for state, n in rows}

    def drop(self) -> None:
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("SET lock_timeout = '10s'")
            for name in self.names:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        self.engine.dispose()
        self._engine = None


# --------------------------------------------------------------------------- the relay


@dataclass
class Running:
    """`outbox-relay --db-file FILE run`, its stderr read by a thread of this process."""

    proc: subprocess.Popen[str]
    command: list[str]
    spawned: float
    started: list[float] = field(default_factory=list)  # each `relay.started` line's arrival
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=40))
    warnings: collections.Counter[str] = field(default_factory=collections.Counter)

    def read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line.rstrip())
            if " relay.started" in line:
                self.started.append(time.perf_counter())
            found = _LEVEL.match(line)
            if found and found.group(2) not in _EXPECTED:
                self.warnings[f"{found.group(1)} {found.group(2)}"] += 1

    def failed(self, why: str) -> ManyError:
        tail = "\n    ".join(self.tail)
        return ManyError(
            f"many-databases relay {why}; command: {' '.join(self.command)}\n    {tail}"
        )

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise self.failed(f"exited with {self.proc.returncode}")


@contextlib.contextmanager
def relay_serving(db_file: Path, amqp_url: str, databases: int) -> Iterator[Running]:
    """The relay started, every database's loop running; SIGTERM and a clean exit at the end."""
    cmd = [
        *relay_command(),
        "--db-file", str(db_file),
        "--amqp", amqp_url,
        "--log-level", "INFO",
        "run",
        "--relay-id", "bench-many",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    running = Running(proc, cmd, time.perf_counter())
    reader = threading.Thread(target=running.read, name="many-relay-log", daemon=True)
    reader.start()
    try:
        yield running
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            raise running.failed("did not exit within 30 s of SIGTERM") from None
        if code != 0:
            raise running.failed(f"exited with {code} after SIGTERM")
        if len(running.started) != databases:
            raise running.failed(f"started {len(running.started)} loops, not {databases}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)


def drain_many(
    running: Running, schemas: Schemas, expected: int, *, before: int, timeout: float
) -> DrainResult:
    """From the first `relay.started` to no row pending or in flight in any schema. `before`:
    the bench database's connections before the relay started (its own are counted at the end,
    as those beyond them)."""
    while not running.started:
        running.alive()
        if time.perf_counter() - running.spawned > START_TIMEOUT:
            raise running.failed(f"did not log relay.started within {START_TIMEOUT:.0f} s")
        time.sleep(0.01)
    begin = running.started[0]
    meter = CpuMeter(running.proc.pid)
    meter.start()
    deadline = begin + timeout
    with schemas.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        while schemas.remaining(conn):
            running.alive()
            if time.perf_counter() > deadline:
                raise running.failed(f"did not drain within {timeout:.0f} s")
            time.sleep(DB_POLL)
        finished = time.perf_counter()
        cpu = meter.stop(finished - begin)
        peak = _peak_rss(running.proc.pid)
        every, stores = schemas.connections(conn)
    states = schemas.by_state()
    if states.get("published", 0) != expected or sum(states.values()) != expected:
        raise ManyError(f"many databases: expected {expected} published rows, found {states}")
    result = DrainResult(
        f"{schemas.count} databases",
        expected,
        finished - begin,
        cpu=cpu,
        peak_rss_bytes=peak,
        startup_seconds=begin - running.spawned,
    )
    last = running.started[-1] if len(running.started) == schemas.count else None
    if last is not None:
        result.notes.append(f"last of {schemas.count} loops started {last - begin:.2f} s later")
    else:
        result.notes.append(f"{len(running.started)} of {schemas.count} loops started")
    result.notes.append(
        f"{every - before} connections to PostgreSQL ({stores} its stores', "
        f"{every - before - stores} others: LISTEN)"
    )
    return result


# --------------------------------------------------------------------------- fairness


@dataclass
class Trickle:
    """One message a transaction, round robin over `schemas`, at `rate` msg/s, from a thread of
    its own until stopped: (tag, the moment its commit returned) for each."""

    engine: Engine
    exchange: str
    schemas: list[str]
    rate: float
    sent: list[tuple[str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _failure: list[BaseException] = field(default_factory=list)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="many-trickle", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        run = uuid.uuid4().hex[:8]
        try:
            with self.engine.connect() as conn:
                start = time.perf_counter()
                n = 0
                while not self._stop.is_set():
                    pause = start + n / self.rate - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                    tag = f"{run}-{n}"
                    schema = self.schemas[n % len(self.schemas)]
                    with conn.begin():
                        conn.exec_driver_sql(f'SET LOCAL search_path TO "{schema}"')
                        outbox.enqueue(
                            conn, exchange=self.exchange, routing_key=TRICKLE_KEY,
                            payload={"t": tag},
                        )  # fmt: skip
                    self.sent.append((tag, time.perf_counter()))
                    n += 1
        except BaseException as exc:
            self._failure.append(exc)

    def stop(self) -> list[tuple[str, float]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._failure:
            raise ManyError(f"the trickle failed: {self._failure[0]!r}") from self._failure[0]
        return self.sent


@dataclass(frozen=True, slots=True)
class Latency:
    p50_ms: float
    p99_ms: float
    samples: int
    seconds: float

    def describe(self, what: str) -> str:
        return (
            f"{what}: p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms "
            f"({self.samples} messages over {self.seconds:.1f} s)"
        )


def _latency(consumer: Consumer, sent: list[tuple[str, float]], seconds: float) -> Latency:
    consumer.wait_for([tag for tag, _ in sent], 60)
    values = [(consumer.arrived[tag] - at) * 1000 for tag, at in sent]
    if len(values) < 2:
        raise ManyError(f"the trickle sent {len(values)} messages: too few for percentiles")
    p50, p99 = percentiles(values)
    return Latency(p50, p99, len(values), seconds)


@dataclass(frozen=True, slots=True)
class Fairness:
    """The same relay after the many-databases drain, every database empty: the trickle into
    all but the first alone; the first draining a backlog alone; then beside the trickle."""

    idle: Latency
    alone: DrainResult
    beside: DrainResult
    busy: Latency  # the trickle while `beside` drained


def fairness(
    running: Running,
    schemas: Schemas,
    broker: BenchBroker,
    amqp_url: str,
    total: int,
    *,
    timeout: float,
) -> Fairness:
    """See Fairness. Each drain's messages are counted in the queue (broker.purged)."""
    queue = f"{broker.queue}-many-trickle"
    _declare(amqp_url, broker.exchange, queue)
    consumer = Consumer(amqp_url, queue)
    consumer.start()
    others = schemas.names[1:]
    try:
        settle()
        trickle = Trickle(schemas.engine, broker.exchange, others, TRICKLE_RATE)
        began = time.perf_counter()
        trickle.start()
        time.sleep(TRICKLE_IDLE)
        idle = _latency(consumer, trickle.stop(), time.perf_counter() - began)
        running.alive()
        alone, _ = broker.purged(
            lambda: _drain_first(running, schemas, total, None, timeout=timeout),
            total,
            "many-alone",
        )
        trickle = Trickle(schemas.engine, broker.exchange, others, TRICKLE_RATE)
        beside, sent = broker.purged(
            lambda: _drain_first(running, schemas, total, trickle, timeout=timeout),
            total,
            "many-beside",
        )
        busy = _latency(consumer, sent, beside.seconds)
    finally:
        consumer.stop()
        _delete(amqp_url, queue)
    return Fairness(idle, alone, beside, busy)


def _drain_first(
    running: Running, schemas: Schemas, total: int, trickle: Trickle | None, *, timeout: float
) -> tuple[DrainResult, list[tuple[str, float]]]:
    """The first database emptied, then `total` messages committed into it at once (its loop
    woken by NOTIFY) and drained, with `trickle` running from TRICKLE_LEAD before; timed from
    the commit to the last row published. The trickle's messages committed meanwhile."""
    first = schemas.names[0]
    schemas.clear(first)
    settle()
    if trickle is not None:
        trickle.start()
        time.sleep(TRICKLE_LEAD)
    try:
        began = schemas.pour(total, first)
        meter = CpuMeter(running.proc.pid)
        meter.start()
        drained = _wait_drained(running, schemas, [first], began + timeout)
        cpu = meter.stop(drained - began)
    finally:
        sent = trickle.stop() if trickle is not None else []
    with schemas.engine.connect() as conn:
        published = conn.exec_driver_sql(
            f"SELECT count(*) FROM \"{first}\".outbox_message WHERE state = 'published'"
        ).scalar_one()
    if published != total:
        raise ManyError(f"{first}: {published} of {total} published")
    result = DrainResult(f"one of {schemas.count} databases", total, drained - began, cpu=cpu)
    if trickle is not None:
        result.notes.append(f"beside {TRICKLE_RATE:.0f} msg/s into {schemas.count - 1} others")
    return result, [(tag, at) for tag, at in sent if began <= at <= drained]


def _wait_drained(running: Running, schemas: Schemas, names: list[str], deadline: float) -> float:
    """The moment `names` hold nothing left to publish (the trickle has the engine's other
    connection)."""
    with schemas.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        while schemas.remaining(conn, names):
            running.alive()
            if time.perf_counter() > deadline:
                raise running.failed("did not drain the backlog beside the trickle in time")
            time.sleep(DB_POLL)
        return time.perf_counter()


def _declare(amqp_url: str, exchange: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, routing_key=TRICKLE_KEY)
    finally:
        conn.close()


def _delete(amqp_url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()


# --------------------------------------------------------------------------- the phase


def measure(
    tag: str,
    args: argparse.Namespace,
    db: BenchDatabase,
    broker: BenchBroker,
    payloads: list[bytes],
    now: float,
    results: Results,
) -> None:
    """The rows `many-one`, `many`, and with 2 databases or more `many-trickle-idle`,
    `many-alone`, `many-beside` and `many-trickle`; the run's ceiling too when it has none yet,
    on the same messages."""
    total = min(MANY_ROWS, db.loaded)
    count = args.many_databases
    if not (ceiling := results.get("ceiling")) or not ceiling.rates:
        settle()
        say(f"ceiling (for the many phase's ratios): raw pika, window {args.window}{tag} ...")
        bounds.ceiling(args, broker, payloads[:total], now, args.window, results, "ceiling")

    db.restore(limit=total)
    settle()
    say(f"{FIGURES['many-one']}, {total} messages{tag} ...")
    one: DrainResult = broker.purged(
        lambda: drain_subprocess(db, args.amqp, timeout=args.timeout), total, "many-one"
    )
    add_drain(results, "many-one", one)

    schemas = Schemas(db, count)
    try:
        say(f"many databases: {count} schemas, {total} messages split over them ...")
        need = PER_DATABASE * count + 4
        if (room := schemas.room()) < need:
            raise ManyError(
                f"the server has room for {room} more connections: {count} databases need up "
                f"to {need} (fewer --many-databases, or a higher max_connections)"
            )
        schemas.create()
        schemas.fill(total)
        with tempfile.TemporaryDirectory(prefix="outbox-bench-many-") as directory:
            db_file = schemas.db_file(Path(directory))
            settle()
            figure = f"relay drain, subprocess `--db-file`, the same over {count} databases"
            say(f"{figure}{tag} ...")
            with schemas.engine.connect() as conn:
                before = schemas.connections(conn)[0]
            with relay_serving(db_file, args.amqp, count) as running:
                many: DrainResult = broker.purged(
                    lambda: drain_many(
                        running, schemas, total, before=before, timeout=args.timeout
                    ),
                    total,
                    "many",
                )
                if running.warnings:
                    many.notes.append(
                        "relay logged "
                        + ", ".join(f"{n} {what}" for what, n in running.warnings.most_common(5))
                    )
                add_drain(results, "many", many)
                results["many"].figure = figure
                if count >= 2:
                    _fairness(tag, args, running, schemas, broker, total, results)
    finally:
        schemas.drop()


def _fairness(
    tag: str,
    args: argparse.Namespace,
    running: Running,
    schemas: Schemas,
    broker: BenchBroker,
    total: int,
    results: Results,
) -> None:
    others = schemas.count - 1
    say(
        f"fairness: {TRICKLE_RATE:.0f} msg/s into {others} databases, the first idle; then "
        f"{total} messages drained from the first, alone and beside that trickle{tag} ..."
    )
    found = fairness(running, schemas, broker, args.amqp, total, timeout=args.timeout)
    row = add(results, "many-trickle-idle", found.idle.p50_ms)
    row.extras.append(found.idle.describe(f"the trickle into {others} databases, all idle"))
    say(f"  {row.extras[-1]}")
    add_drain(results, "many-alone", found.alone)
    add_drain(results, "many-beside", found.beside)
    row = add(results, "many-trickle", found.busy.p50_ms)
    row.extras.append(
        found.busy.describe("the same beside the first database draining")
        + f"; p50 {found.busy.p50_ms / found.idle.p50_ms:.1f}x idle"
    )
    say(f"  {row.extras[-1]}")


def ratio_line(results: Results) -> str | None:
    """Many databases against one, for the report: rates, CPU per message, the trickle."""
    many, one = results.get("many"), results.get("many-one")
    if not (many and one and many.rates and one.rates):
        return None
    over = many.figure.rsplit(" over ", 1)[-1]  # "10 databases"
    line = f"{over} / one database, the same messages: rate {many.rate / one.rate:.2f}x"
    if many.relay_us and one.relay_us:
        a, b = statistics.median(many.relay_us), statistics.median(one.relay_us)
        line += f", relay CPU per message {a:.0f} us / {b:.0f} us = {a / b:.2f}x"
    alone, beside = results.get("many-alone"), results.get("many-beside")
    if alone and beside and alone.rates and beside.rates:
        line += (
            f"; one of them draining alone {alone.rate / one.rate:.2f}x one database, beside "
            f"a trickle into the others {beside.rate / one.rate:.2f}x"
        )
    busy, idle = results.get("many-trickle"), results.get("many-trickle-idle")
    if busy and idle and busy.rates and idle.rates and idle.rate > 0:
        line += (
            f"; the trickle's p50 beside that drain {busy.rate:.1f} ms, idle {idle.rate:.1f} ms "
            f"= {busy.rate / idle.rate:.1f}x"
        )
    return line + f" (median of {len(many.rates)} run(s) each)"
