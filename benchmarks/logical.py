"""The `logical` phase: what `--capture logical` (docs/guides/logical-capture.md) gains and costs,
beside the table mode in the same run, on 80-byte bodies, in a database of its own (a slot reads
a whole database) with a replication slot and publication of its own.

- The raw pika ceiling on the backlog's bodies; the relay draining the backlog from the table
  (in-process, as the small phase does); then from the log: the same messages emitted by
  `outbox.enqueue` in logical mode, 5,000 a transaction as the table's backlog was loaded, all
  committed before the relay starts. The slot is first moved to the end of the log, its restart
  point too (checkpoints and pg_replication_slot_advance), so that the relay's stream decodes
  the backlog and not the WAL the phases before it wrote; a transaction left open elsewhere on
  the server can hold the restart point back, and each drain's details say how much WAL its
  stream read before the backlog. Then, as a diagnostic, a backlog of one message a
  transaction.
- The CPU of each drain: the relay's process, and the database's, counted as the server
  processes that served the phase's database (its backends, the walsender streaming the slot
  among them) and the server's WAL writer, checkpointer and background writer; other databases'
  backends on the same server are left out (every database process's CPU is printed beside).
- One writer's commits/s: a business row alone; with one message emitted into the log
  (`outbox.enqueue`, logical); with the same emit sent bare (`outbox.logged.EMIT_SQL`, no
  library: the database's own cost of a message in the log); with a statement that writes
  nothing (`SELECT 1`: what a second round trip costs, whatever it sends); with one message in
  the table (`outbox.enqueue`, table mode, its defaults). Interleaved rounds, each ratio the
  median over the rounds of that round's ratio to the business row alone (insert_cost's way).
- Commit-to-consumer latency at a steady LATENCY_RATE msg/s with `outbox-relay run --capture
  logical`, and with the table mode's relay (LISTEN), beside RabbitMQ's floor: the same messages
  published with confirms by raw pika to the same consumer (benchmarks/latency.py), alternated.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

import outbox
from benchmarks import bounds
from benchmarks.drain import drain_in_process, relay_command
from benchmarks.enqueue_cost import _business_table, _enqueue
from benchmarks.fixtures import ROUTING_KEY, BenchBroker, BenchDatabase, encode, make_payload
from benchmarks.insert_cost import _prepared, _rate, _ratio
from benchmarks.latency import consumer_samples, percentiles
from benchmarks.results import FIGURES, Results, add, add_drain, say, settle
from outbox import logged
from outbox.config import settings
from relay.capture import admin
from relay.capture.pgoutput import parse_lsn

EMIT_BATCH = 5000  # messages per transaction of the log's backlog (as fixtures.LOAD_BATCH)
SINGLE = 20_000  # messages of the diagnostic backlog of one message a transaction, at most
LATENCY_RATE = 200.0  # msg/s of the latency runs
LATENCY_SECONDS = 5.0  # of each run
LATENCY_RUNS = 2  # floor, log and table alternated, per round of the phase
LATENCY_IDLE = 1.0  # seconds each relay (and the floor) idles before its run
LATENCY_KEY = "r"  # benchmarks/latency.py's routing key

# The server processes that serve the phase: its database's backends (the walsender of a
# logical slot has the database's name), and the server's own writers of WAL and pages.
_SERVED = text(
    "SELECT pid, backend_type FROM pg_stat_activity"
    " WHERE (datname = current_database() AND pid <> pg_backend_pid())"
    " OR backend_type IN ('walwriter', 'checkpointer', 'background writer')"
)
# Move the slot to the end of the flushed log: what was written before is not the backlog's.
_SKIP = text("SELECT pg_replication_slot_advance(:slot, pg_current_wal_flush_lsn())")
_FLUSHED = text("SELECT pg_current_wal_flush_lsn()::text")
# What a stream opened now reads: from the slot's restart_lsn (the oldest WAL it still needs to
# rebuild what was in progress) to its confirmed position, decoded and dropped; then the rest.
_SPAN = text(
    "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::bigint,"
    " pg_wal_lsn_diff(pg_current_wal_flush_lsn(), confirmed_flush_lsn)::bigint"
    " FROM pg_replication_slots WHERE slot_name = :slot"
)
_TERMINATE = text(
    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
    " WHERE slot_name = :slot AND active_pid IS NOT NULL"
)


@contextlib.contextmanager
def library(capture: str, slot: str) -> Iterator[None]:
    """outbox.enqueue in `capture` mode ("logical" for `slot`) inside; as it was after."""
    before = settings()
    outbox.configure(capture=capture, capture_slot=slot)
    try:
        yield
    finally:
        outbox.configure(capture=before.capture, capture_slot=before.capture_slot)


class Captured:
    """The phase's database, its table backlog (`db.load`) and its slot and publication, both
    named `slot`; `drop()` removes all three, a relay still reading the slot or not."""

    def __init__(self, admin_url: str, name: str) -> None:
        self.db = BenchDatabase(admin_url, name)
        self.slot = name

    def create(self, messages: int, exchange: str) -> None:
        self.db.create()
        with library("table", self.slot):
            self.db.load(messages, bounds.SMALL_BYTES, exchange)
        admin.setup(self._engine, slot=self.slot, publication=self.slot)

    @property
    def _engine(self) -> Engine:
        assert self.db.engine is not None
        return self.db.engine

    def served(self) -> dict[int, str]:
        """The server processes serving the database now, pid: what it is (CpuMeter's
        `database`)."""
        with self._engine.connect() as conn:
            return {int(pid): str(kind) for pid, kind in conn.execute(_SERVED)}

    def skip(self) -> None:
        """The slot moved to the end of the flushed log (nothing before it is published), and
        its restart_lsn with it: a stream opened later reads (and drops) the WAL from the
        restart_lsn to the confirmed position, which `span` says. The server moves the restart
        point only to a running_xacts record the slot has passed once before (a checkpoint
        logs one): hence two rounds. A transaction that was running then, on any database of
        the server, still holds it back."""
        self.released()
        with self._engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for _ in range(2):
                conn.exec_driver_sql("CHECKPOINT")
                conn.execute(_SKIP, {"slot": self.slot})

    def emit(self, count: int, exchange: str, *, per_transaction: int = EMIT_BATCH) -> int:
        """The table emptied, the slot moved to the log's end, then `count` 80-byte messages
        emitted by outbox.enqueue in logical mode, `per_transaction` a transaction (their commits
        not waiting for the disk when one each: the load is not timed), and a checkpoint (as
        BenchDatabase.analyze ends the table's restore); the log's flushed end after them."""
        self.db.empty()
        self.skip()
        with library("logical", self.slot), self._engine.connect() as conn:
            if per_transaction == 1:
                conn.exec_driver_sql("SET synchronous_commit = off")
                conn.commit()
            for first in range(0, count, per_transaction):
                with conn.begin():
                    for n in range(first, min(count, first + per_transaction)):
                        outbox.enqueue(
                            conn,
                            exchange=exchange,
                            routing_key=ROUTING_KEY,
                            payload=make_payload(n, bounds.SMALL_BYTES),
                        )
            conn.exec_driver_sql("RESET synchronous_commit")
            conn.commit()
        with self._engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("CHECKPOINT")  # flushes the log, too
            return parse_lsn(str(conn.execute(_FLUSHED).scalar_one()))

    def span(self) -> str:
        """The WAL a stream opened now reads before the slot's confirmed position, and after."""
        with self._engine.connect() as conn:
            before, after = conn.execute(_SPAN, {"slot": self.slot}).one()
        return (
            f"the walsender reads {before / 2**20:.1f} MiB before the backlog (from the slot's "
            f"restart_lsn), {after / 2**20:.1f} MiB with it"
        )

    def released(self, timeout: float = 20.0) -> admin.SlotStatus:
        """The slot once no stream reads it (the server frees it when its reader's connection
        ends); RuntimeError if one still does after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            state = admin.slot_state(self._engine, self.slot, publication=self.slot)
            if not state.active:
                return state
            if time.monotonic() > deadline:
                raise RuntimeError(f"replication slot {self.slot} still read after {timeout:.0f} s")
            time.sleep(0.05)

    def drop(self) -> None:
        if self.db.engine is not None:
            try:
                self.released()
            except RuntimeError:  # a relay left reading it: end its walsender
                with self.db.engine.connect() as conn:
                    conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                        _TERMINATE, {"slot": self.slot}
                    )
                self.released()
            admin.drop(self.db.engine, slot=self.slot, publication=self.slot)
        self.db.drop()


# --------------------------------------------------------------------------- the phase


def measure(
    tag: str,
    args: argparse.Namespace,
    cap: Captured,
    broker: BenchBroker,
    now: float,
    results: Results,
) -> None:
    """One round of the phase: ceiling, table drain, log drain, enqueue cost, latency."""
    n = cap.db.loaded
    bodies = [encode(make_payload(i, bounds.SMALL_BYTES)) for i in range(n)]
    settle()
    say(f"ceiling, {bounds.SMALL_BYTES}-byte bodies, window {args.window}{tag} ...")
    bounds.ceiling(args, broker, bodies, now, args.window, results, "logical-ceiling")

    cap.db.restore()
    settle()
    say(f"relay drain from the table, in-process, {bounds.SMALL_BYTES}-byte bodies{tag} ...")
    table = broker.purged(
        lambda: drain_in_process(cap.db, args.amqp, timeout=args.timeout, database_pids=cap.served),
        n,
        "logical-table",
    )
    add_drain(results, "logical-table", table)

    _from_log(tag, args, cap, broker, results, "logical", n, EMIT_BATCH)
    _from_log(tag, args, cap, broker, results, "logical-single", min(n, SINGLE), 1)

    assert cap.db.engine is not None
    say(f"enqueue cost: one writer, a business row with a message in the log{tag} ...")
    cost = measure_emit_cost(cap, broker.exchange)
    row = add(results, "logical-enqueue", cost.ratios[LOGGED])
    row.extras.append(cost.describe())
    add(results, "logical-enqueue-bare", cost.ratios[BARE])
    add(results, "logical-enqueue-nothing", cost.ratios[NOTHING])
    add(results, "logical-enqueue-table", cost.ratios[TABLE])
    say(f"  {cost.describe()}")

    say(
        f"commit-to-consumer at {LATENCY_RATE:.0f} msg/s, from the log and from the table, "
        f"beside the broker's floor{tag} ..."
    )
    measure_latency(cap, broker, args.amqp, results)


def _from_log(
    tag: str,
    args: argparse.Namespace,
    cap: Captured,
    broker: BenchBroker,
    results: Results,
    key: str,
    count: int,
    per_transaction: int,
) -> None:
    """`count` messages emitted into the log, `per_transaction` a transaction, then drained by
    the relay reading the slot (in-process), recorded under `key`; the slot must have been
    confirmed past all of them once the relay let it go."""
    say(f"emitting {count} messages into the log, {per_transaction} a transaction ...")
    end = cap.emit(count, broker.exchange, per_transaction=per_transaction)
    span = cap.span()
    settle()
    say(f"{FIGURES[key]}{tag} ...")
    drained = broker.purged(
        lambda: drain_in_process(
            cap.db,
            args.amqp,
            timeout=args.timeout,
            expected=count,
            capture_slot=cap.slot,
            database_pids=cap.served,
        ),
        count,
        key,
    )
    confirmed = cap.released().confirmed_lsn
    if confirmed is None or parse_lsn(confirmed) < end:
        raise RuntimeError(f"{key}: the slot was confirmed up to {confirmed}, not past the backlog")
    drained.notes.append(span)
    add_drain(results, key, drained)


# --------------------------------------------------------------------------- enqueue cost

ALONE = "business row alone"
LOGGED = "+ outbox.enqueue into the log"
BARE = "+ the same emit, bare (no library)"
NOTHING = "+ a statement that writes nothing (SELECT 1)"
TABLE = "+ outbox.enqueue into the table"


@dataclass(frozen=True, slots=True)
class EmitCost:
    rates: dict[str, float]  # commits/s per variant (median over rounds)
    ratios: dict[str, float]  # per variant: median over rounds of its rate / the row alone's
    rounds: int
    # us per statement inside one open transaction (no commit), the fastest of the rounds: the
    # statements' own cost, without the commits' noise
    statement_us: dict[str, float]

    def describe(self) -> str:
        each = ", ".join(
            f"{name[2:]} {self.rates[name]:,.0f} = {self.ratios[name]:.2f}x"
            for name in (LOGGED, BARE, NOTHING, TABLE)
        )
        statements = ", ".join(f"{name[2:]} {us:.0f} us" for name, us in self.statement_us.items())
        return (
            f"one writer: business row alone {self.rates[ALONE]:,.0f} commits/s; {each} "
            f"(median of {self.rounds} interleaved rounds); per statement inside one "
            f"transaction: {statements}"
        )


def measure_emit_cost(
    cap: Captured,
    exchange: str,
    *,
    rounds: int = 20,
    seconds: float = 0.4,
    statements: int = 2000,
    statement_rounds: int = 5,
) -> EmitCost:
    """Interleaved rounds of the kinds of transaction (the module's docstring); then each
    variant's statement `statements` times in one transaction, rolled back, `statement_rounds`
    times. What they emit stays in the slot until the next `skip`: no relay reads it."""
    engine = cap.db.engine
    assert engine is not None
    _business_table(engine)
    enqueue = _enqueue(exchange)
    packed = logged.pack(_prepared(exchange).params, delay=None, has_row=False)

    def bare(conn: Connection) -> None:
        conn.exec_driver_sql(logged.EMIT_SQL, {"message": packed}).close()

    def nothing(conn: Connection) -> None:
        conn.exec_driver_sql("SELECT 1").close()

    variants: dict[str, tuple[str, Callable[[Connection], object] | None]] = {
        ALONE: ("table", None),
        LOGGED: ("logical", enqueue),
        BARE: ("table", bare),
        NOTHING: ("table", nothing),
        TABLE: ("table", enqueue),
    }
    found: dict[str, list[float]] = {name: [] for name in variants}
    each: dict[str, list[float]] = {name: [] for name in variants if name != ALONE}
    try:
        with library("logical", cap.slot):
            _rate(engine, 0.5, enqueue)  # warm up: connections, caches, the slot's check
        for _ in range(rounds):
            for name, (capture, extra) in variants.items():
                with library(capture, cap.slot):
                    found[name].append(_rate(engine, seconds, extra))
        with engine.connect() as conn:
            for _ in range(statement_rounds):
                for name in each:
                    capture, extra = variants[name]
                    assert extra is not None
                    with library(capture, cap.slot), conn.begin() as tx:
                        for _ in range(50):  # prepared on the server from the fifth run
                            extra(conn)
                        started = time.perf_counter()
                        for _ in range(statements):
                            extra(conn)
                        each[name].append((time.perf_counter() - started) / statements * 1e6)
                        tx.rollback()
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS bench_order")
            conn.exec_driver_sql("DELETE FROM outbox_message")
    return EmitCost(
        rates={name: statistics.median(values) for name, values in found.items()},
        ratios={name: _ratio(found[name], found[ALONE]) for name in variants},
        rounds=rounds,
        statement_us={name: min(values) for name, values in each.items()},
    )


# --------------------------------------------------------------------------- latency


def measure_latency(cap: Captured, broker: BenchBroker, amqp_url: str, results: Results) -> None:
    """LATENCY_RUNS runs each of the floor, the log's relay and the table's relay, alternated;
    p50 and p99 of each, every run's samples pooled."""
    engine = cap.db.engine
    assert engine is not None
    url = cap.db.url

    def started(capture: str) -> Callable[[], subprocess.Popen[bytes]]:
        def start() -> subprocess.Popen[bytes]:
            # The application's side in the relay's mode: benchmarks/latency.py commits with
            # outbox.enqueue once the relay is started.
            if capture == "logical":
                cap.skip()  # what the enqueue cost emitted is no one's
            outbox.configure(capture=capture, capture_slot=cap.slot)
            return subprocess.Popen(
                [*relay_command(), "--db", url, "--amqp", amqp_url, "--log-level", "warning",
                 "run", "--relay-id", f"bench-latency-{capture}", "--capture", capture,
                 "--capture-slot", cap.slot],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip

        return start

    with library("table", cap.slot):  # restored after
        found = consumer_samples(
            engine,
            amqp_url,
            broker.exchange,
            broker.queue,
            {"log": started("logical"), "table": started("table")},
            runs=LATENCY_RUNS,
            seconds=LATENCY_SECONDS,
            rate=LATENCY_RATE,
            idle=LATENCY_IDLE,
        )
    broker.purge()
    cap.released()
    f50, f99 = percentiles(found.floor)
    l50, l99 = percentiles(found.relayed["log"])
    t50, t99 = percentiles(found.relayed["table"])
    for key, value in (
        ("logical-latency", l50),
        ("logical-latency-p99", l99),
        ("logical-floor", f50),
        ("logical-floor-p99", f99),
        ("logical-latency-table", t50),
        ("logical-latency-table-p99", t99),
    ):
        add(results, key, value)
    count = len(found.floor)
    detail = (
        f"at {LATENCY_RATE:.0f} msg/s, {count} messages each: from the log p50 {l50:.2f} ms, "
        f"p99 {l99:.2f} ms; from the table p50 {t50:.2f} ms, p99 {t99:.2f} ms; the broker's "
        f"floor p50 {f50:.2f} ms, p99 {f99:.2f} ms; "
        + "; ".join(f"{what.strip()} {value}" for what, value, _ in found.runs)
    )
    results["logical-latency"].extras.append(detail)
    say(f"  {detail}")
