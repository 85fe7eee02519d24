"""One relay serving many databases (`run --db-file`), under the faults that matter to it: 20
databases (8 SQLite files, 6 PostgreSQL databases, 6 schemas of one more PostgreSQL database),
migrated by `outbox-relay migrate --db-file` and served by one `outbox-relay run --db-file`.

- A: 19 of them get a trickle (TRICKLE_RATE keyed messages a second each, TRICKLE_KEYS keys
  each), written by a process of its own, and its latency is measured: from the commit (the
  writer's clock right after it returned) to the consumer's (a process of its own, on a queue
  of the trickle's own).
- B: the 20th ("behind") gets BACKLOG messages at once (enqueue_many, BACKLOG_TRANSACTIONS
  transactions, written by a process of its own), read from a queue of its own by another
  consumer process: the trickle's latency while it drains, against A's, is what one database
  far behind costs the others through the broker connection they share.
- During B one PostgreSQL database ("unreachable", served through a TcpProxy) is cut off for
  CUT_DOWN seconds while its writer goes on writing to it directly: how long after the restore
  every message committed before it had arrived. /readyz is read meanwhile.
- C: the relay is SIGKILLed KILLS times at random moments and started again at once.

Then the writers stop, everything settles, and the checker counts lost, unexpected, duplicated
and out-of-order messages across all databases (ids are unique across them; every key belongs
to one database: its name prefixes it). The row passes when the checker does, B's p50 is within
MAX_RATIO of A's, and the cut database caught up within MAX_CATCH_UP seconds of the restore.

The cut database's messages are left out of B's latency (they wait out the cut on purpose); the
catch-up figure is theirs.

PostgreSQL connections (max_connections may be 100, shared with other work): the relay takes 4
for each of the 12 PostgreSQL databases (two for its loop, the heartbeat's, the LISTEN one: 48),
for a moment more across a restart; the writers 7 (one for each PostgreSQL database they write,
the schemas' one shared), made before the relay starts and held to the end; the harness one
more, to watch pg_stat_activity. The peaks, and how often PostgreSQL refused the relay a
connection, are in the note: a server full of other work's connections leaves the cut database
waiting for one after the restore, which the catch-up figure then shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import queue
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pika
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

import outbox
from tests.chaos.checker import DeliveryChecker
from tests.chaos.run import AMQP_URL, PG_URL, ROOT, Relay, Row, table, topology
from tests.support.ports import free_port
from tests.support.proxy import TcpProxy

NAME = "many databases: 20, one unreachable, one 50,000 behind, relay SIGKILL x3"
SQLITE, PG_DATABASES, PG_SCHEMAS = 8, 6, 6
CUT, BEHIND = "unreachable", "behind"  # the two PostgreSQL databases the faults are about
TRICKLE_RATE = 8.0  # messages a second, each database
TRICKLE_KEYS = 4  # each database's keys
ROLLBACK_EVERY = 20  # every 20th trickle transaction rolls back: its message must never arrive
BACKLOG, BACKLOG_TRANSACTIONS = 50_000, 5
BACKLOG_KEYS, BACKLOG_KEYED_EVERY = 200, 10  # every 10th backlog message keyed, as mid_drain's
PHASE_A, WARM_UP = 15.0, 1.0  # seconds of trickle alone; its first second is not measured
CUT_AFTER, CUT_DOWN = 2.0, 8.0  # the cut starts 2 s after the backlog's first commit
KILLS, KILL_BETWEEN = 3, (1.5, 5.0)
AFTER_KILLS = 4.0  # seconds of trickle after the last restart
MAX_RATIO, MAX_CATCH_UP = 2.0, 10.0
WRITER = "outbox-chaos-writer"  # the writers' application_name (the relay's: "outbox-relay")
# Short leases and confirm timeouts (as run.RELAY_FLAGS), LISTEN on: PostgreSQL databases are
# woken by their commits, SQLite ones poll every 50 ms.
FLAGS = ["--lease", "6", "--confirm-timeout", "3", "--poll-interval", "0.05",
         "--drain-timeout", "5"]  # fmt: skip


@dataclass(frozen=True)
class Tenant:
    name: str  # what the relay calls it (its default name, or the file's)
    url: str  # the writers'
    relay_url: str  # the relay's: the cut database's goes through the proxy
    kind: str  # "sqlite", "database" or "schema"
    named: bool = False  # named in the file (NAME = URL) rather than after its URL
    schema: str | None = None  # a schema's name: its writer uses its database's connection
    database_url: str = ""  # a schema's database's URL (without the search_path)


@dataclass(frozen=True)
class Latency:
    p50: float  # milliseconds
    p99: float
    count: int
    kinds: tuple[tuple[str, float], ...] = ()  # each kind of database's p50

    def __str__(self) -> str:
        kinds = ", ".join(f"{kind} {p50:.0f}" for kind, p50 in self.kinds)
        return (
            f"p50 {self.p50:.0f} ms, p99 {self.p99:.0f} ms ({self.count:,} messages"
            f"{f'; p50 {kinds} ms' if kinds else ''})"
        )


@dataclass(frozen=True)
class Figures:
    a: Latency
    b: Latency
    c: Latency
    backlog_s: float  # from the backlog's first commit to its last arrival
    drained: bool  # whether the backlog drained within 180 s (else backlog_s is that wait)
    cut_written: int  # messages the cut database's writer committed while it was cut
    catch_up_s: float | None  # from the restore until they (and all before) had arrived
    readyz: str  # what /readyz said of the databases during the cut
    peak_connections: int  # to this run's PostgreSQL databases
    peak_by: str  # those, by application_name
    relay_connections: int  # the relay's peak
    server_connections: int  # to the whole server
    max_connections: int  # the server's
    refused: int  # the relay's log lines saying PostgreSQL refused a connection: too many clients
    relay_cpu_a: float  # CPUs the relay used during A (the trickle alone)
    relay_cpu_b: float  # CPUs the relay used while the backlog drained (1.0: one, all the time)
    load_b: float  # the machine's load average at the drain's end
    tracebacks: int  # in the relay's log
    starts: int  # the relay's: 1 + KILLS, unless it exited on its own
    errors: tuple[str, ...]  # the writers'

    @property
    def ratio(self) -> float:
        return self.b.p50 / self.a.p50 if self.a.p50 > 0 else math.inf


@dataclass
class TenantsRow(Row):
    figures: Figures | None = None

    @property
    def ok(self) -> bool:
        f = self.figures
        return (
            super().ok
            and f is not None
            and not f.errors
            and f.ratio <= MAX_RATIO
            and f.catch_up_s is not None
            and f.catch_up_s <= MAX_CATCH_UP
        )


# --------------------------------------------------------------------------- processes
# Spawned (not forked: the harness has threads), each reporting on one queue, in its own order:
#   ("c", id, key, committed_at, database)   a trickle message committed (time.time())
#   ("r", id)                                a trickle message rolled back
#   ("b", [(id, key), ...], committed_at)    a backlog transaction committed
#   ("m", [(id, received_at), ...])          deliveries, as the consumer took them
#   ("e", where, error)                      a writer's failure
#   ("done", source)                         a writer process ended


def _writer_engine(url: str) -> Engine:
    """No pool: each writer holds the one connection it makes (see _connect)."""
    # SQLite: the relay holds the write lock for a claim or a settle now and then: wait for it.
    sqlite = url.startswith("sqlite")
    connect_args: dict[str, Any] = {"timeout": 30} if sqlite else {"application_name": WRITER}
    return create_engine(url, poolclass=NullPool, connect_args=connect_args)


def _connect(engine: Engine, within: float = 60.0) -> Connection:
    """A connection, tried again for `within` seconds: nothing is written before it exists (a
    server shared with other work may refuse one for a while: too many clients). Each writer
    makes its connection before the run starts and holds it to the end, so that other work
    taking connections later cannot stop it."""
    deadline = time.monotonic() + within
    while True:
        try:
            return engine.connect()
        except OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


Group = tuple[str, list[tuple[str, str | None]]]  # a URL, its databases: (name, schema)


def trickle(
    groups: list[Group], exchange: str, rate: float, out: Queue[Any], begin: Event, stop: Event
) -> None:
    """A thread for each group, connected at once: from `begin` until `stop`, one keyed message
    a transaction at `rate` for each of its databases, in turn."""
    threads = [
        threading.Thread(target=_trickle_group, args=(group, exchange, rate, out, begin, stop))
        for group in groups
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(("done", "trickle"))


def _trickle_group(
    group: Group, exchange: str, rate: float, out: Queue[Any], begin: Event, stop: Event
) -> None:
    """One connection for the group's databases: the schemas of one PostgreSQL database share
    one (SET LOCAL search_path in each transaction), to spare the server's connections."""
    url, members = group
    engine = _writer_engine(url)
    try:
        conn = _connect(engine)
    except OperationalError as exc:
        out.put(("e", url, repr(exc)[:300]))
        engine.dispose()
        return
    begin.wait()
    pause = 1.0 / (rate * len(members))
    next_at = time.monotonic() + random.uniform(0.0, pause)  # spread over the period
    turn = 0
    try:
        while True:
            next_at += pause
            if stop.wait(max(0.0, next_at - time.monotonic())):
                return
            name, schema = members[turn % len(members)]
            n = turn // len(members)  # this database's transactions so far
            turn += 1
            key = f"{name}/k{n % TRICKLE_KEYS}"
            rollback = n % ROLLBACK_EVERY == ROLLBACK_EVERY - 1
            try:
                tx = conn.begin()
                if schema is not None:
                    conn.execute(text(f'SET LOCAL search_path TO "{schema}"'))
                message_id = outbox.enqueue(
                    conn, exchange=exchange, routing_key="trickle",
                    payload={"database": name, "n": n}, key=key,
                )  # fmt: skip
                if rollback:
                    tx.rollback()
                else:
                    tx.commit()
                at = time.time()
                if rollback:
                    out.put(("r", str(message_id)))
                else:
                    out.put(("c", str(message_id), key, at, name))
            except Exception as exc:
                out.put(("e", name, repr(exc)[:300]))
    finally:
        conn.close()
        engine.dispose()


def backlog(
    name: str, url: str, exchange: str, messages: int, transactions: int, go: Event,
    out: Queue[Any],
) -> None:  # fmt: skip
    """`messages` in `transactions` transactions of enqueue_many, once `go` is set."""
    engine = _writer_engine(url)
    per = math.ceil(messages / transactions)
    chunks = []
    for start in range(0, messages, per):
        chunk = []
        for n in range(start, min(messages, start + per)):
            keyed = n % BACKLOG_KEYED_EVERY == 0
            key = f"{name}/k{n % BACKLOG_KEYS}" if keyed else None
            chunk.append(
                {"exchange": exchange, "routing_key": "backlog", "payload": {"n": n}, "key": key}
            )
        chunks.append(chunk)
    try:
        with _connect(engine) as conn:
            go.wait()
            for chunk in chunks:
                with conn.begin():
                    ids = outbox.enqueue_many(conn, chunk)
                at = time.time()
                out.put(("b", [(str(i), c["key"]) for i, c in zip(ids, chunk, strict=True)], at))
    except Exception as exc:
        out.put(("e", name, repr(exc)[:300]))
    finally:
        engine.dispose()
        out.put(("done", "backlog"))


def consume(queue_name: str, out: Queue[Any], stop: Event, ready: Event) -> None:
    """Read `queue_name` (auto-ack: the broker is not faulted here) and report each delivery with
    the moment it was taken, until `stop`."""
    while not stop.is_set():
        try:
            conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        except pika.exceptions.AMQPError:
            time.sleep(0.5)
            continue
        try:
            channel = conn.channel()
            batch: list[tuple[str, float]] = []

            def on_message(_ch: Any, _method: Any, props: Any, _body: bytes) -> None:
                batch.append((props.message_id, time.time()))

            channel.basic_consume(queue_name, on_message, auto_ack=True)
            ready.set()
            while not stop.is_set():
                conn.process_data_events(time_limit=0.02)
                if batch:
                    out.put(("m", list(batch)))
                    batch.clear()
            conn.close()
        except pika.exceptions.AMQPError:
            time.sleep(0.5)


# --------------------------------------------------------------------------- the harness


class Ledger:
    """What the writers committed and the consumers took, and when (time.time()), fed from the
    processes' queue by one thread, in each process's order, into the checker."""

    def __init__(self, checker: DeliveryChecker, out: Queue[Any]) -> None:
        self.checker, self._out = checker, out
        self._lock = threading.Lock()
        self.committed_at: dict[str, float] = {}
        self.database_of: dict[str, str] = {}  # trickle ids
        self.received_at: dict[str, float] = {}  # first delivery
        self.backlog_ids: set[str] = set()
        self.backlog_commits: list[float] = []
        self.errors: list[str] = []
        self.done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-ledger")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._out.get(timeout=0.1)
            except queue.Empty:
                continue
            self._take(item)

    def _take(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        checker = self.checker
        if kind == "m":
            for message_id, at in item[1]:
                checker.received(message_id)
                with self._lock:
                    self.received_at.setdefault(message_id, at)
        elif kind == "c":
            _, message_id, key, at, database = item
            checker.committed(message_id, key)
            with self._lock:
                self.committed_at[message_id] = at
                self.database_of[message_id] = database
        elif kind == "r":
            checker.rolled_back(item[1])
        elif kind == "b":
            _, written, at = item
            for message_id, key in written:
                checker.committed(message_id, key)
            with self._lock:
                for message_id, _key in written:
                    self.committed_at[message_id] = at
                self.backlog_ids.update(i for i, _ in written)
                self.backlog_commits.append(at)
        elif kind == "e":
            with self._lock:
                self.errors.append(f"{item[1]}: {item[2]}")
        elif kind == "done":
            with self._lock:
                self.done.add(item[1])

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `condition()`; RuntimeError after `timeout` s, or at once if a writer failed."""
        if not self.reached(condition, timeout, what):
            raise RuntimeError(f"{NAME}: {what} not within {timeout:g} s")

    def reached(self, condition: Callable[[], bool], timeout: float, what: str) -> bool:
        """Whether `condition()` came true within `timeout` s; RuntimeError if a writer failed."""
        deadline = time.monotonic() + timeout
        while not condition():
            with self._lock:
                errors = list(self.errors)
            if errors:
                raise RuntimeError(f"{NAME}: waiting for {what}, a writer failed: {errors[:3]}")
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def arrived(self, ids: Sequence[str] | set[str]) -> bool:
        with self._lock:
            return all(i in self.received_at for i in ids)

    def trickle_ids(
        self, start: float, end: float, *, only: str | None = None, but: str | None = None
    ) -> list[str]:
        """The trickle's messages committed from `start` to `end`, of database `only`, or of
        every one but `but`."""
        with self._lock:
            return [
                i for i, d in self.database_of.items()
                if start <= self.committed_at[i] < end and (only is None or d == only)
                and d != but
            ]  # fmt: skip

    def latency(self, ids: Sequence[str], kinds: dict[str, str] | None = None) -> Latency:
        """Commit to consume, in ms; with `kinds` (database -> kind), each kind's p50 too."""
        with self._lock:
            found = [
                (self.database_of.get(i, ""), (self.received_at[i] - self.committed_at[i]) * 1e3)
                for i in ids
                if i in self.received_at
            ]
        ms = sorted(m for _, m in found)
        each: list[tuple[str, float]] = []
        for kind in sorted(set((kinds or {}).values())):
            of_kind = sorted(m for d, m in found if kinds and kinds.get(d) == kind)
            each.append((kind, _percentile(of_kind, 0.50)))
        return Latency(_percentile(ms, 0.50), _percentile(ms, 0.99), len(ms), tuple(each))

    def last_arrival(self, ids: Sequence[str] | set[str]) -> float:
        with self._lock:
            return max((self.received_at[i] for i in ids if i in self.received_at), default=0.0)


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time process `pid` has used (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank; nan for none."""
    if not values:
        return math.nan
    return values[max(0, math.ceil(q * len(values)) - 1)]


class FileRelay(Relay):
    """`outbox-relay --db-file FILE run`."""

    def __init__(self, db_file: Path, log: Path, flags: Sequence[str]) -> None:
        super().__init__(str(db_file), AMQP_URL, log, flags)
        self.argv = [sys.executable, "-m", "relay", "--db-file", str(db_file), "--amqp",
                     AMQP_URL, "run", *flags]  # fmt: skip

    def started(self) -> set[str]:
        """The databases whose loop has logged relay.started since this relay's last start."""
        lines = self.log.read_text(errors="replace").splitlines()
        # Each start begins with its broker connection: look after the last of those.
        firsts = [n for n, line in enumerate(lines) if " relay.databases " in line]
        tail = lines[firsts[-1] :] if firsts else []
        return {
            field.removeprefix("database=")
            for line in tail
            if " relay.started " in line
            for field in line.split()
            if field.startswith("database=")
        }


@contextlib.contextmanager
def databases(suffix: str, workdir: Path) -> Iterator[list[Tenant]]:
    """8 SQLite files, 6 PostgreSQL databases and 6 schemas in a 7th: created here (not yet
    migrated), removed at the end."""
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    names = [f"chaos_{suffix}_{n}" for n in range(PG_DATABASES)]
    holder = f"chaos_{suffix}_schemas"
    directory = workdir / f"chaos-tenants-{suffix}"
    created: list[str] = []
    try:
        directory.mkdir()
        with _connect(admin) as conn:
            for name in [*names, holder]:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
                created.append(name)
        holder_url = make_url(PG_URL).set(database=holder)
        schemas = [f"tenant_{n}" for n in range(PG_SCHEMAS)]
        with create_engine(holder_url, poolclass=NullPool).begin() as conn:
            for schema in schemas:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        tenants = [
            Tenant(f"lite{n}", f"sqlite:///{directory / f'lite{n}.db'}", "", "sqlite")
            for n in range(SQLITE)
        ]
        for n, name in enumerate(names):
            url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
            special = {0: CUT, 1: BEHIND}.get(n)
            tenants.append(Tenant(special or name, url, "", "database", named=bool(special)))
        for schema in schemas:
            options = urllib.parse.quote(f"-csearch_path={schema}")
            holder_plain = holder_url.render_as_string(hide_password=False)
            url = f"{holder_plain}?options={options}"
            tenants.append(
                Tenant(schema, url, "", "schema", schema=schema, database_url=holder_plain)
            )
        yield tenants
    finally:
        with _connect(admin) as conn:
            for name in created:
                conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(directory, ignore_errors=True)


class ConnectionWatch:
    """The most PostgreSQL connections seen at once, every 0.2 s (on a connection of its own):
    to this run's databases (`peak`), the relay's among them (`relay_peak`: its pools' are named
    outbox-relay, its LISTEN connections are not named: every one but the writers'), and to the
    whole server (`server_peak`: other work shares it)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.peak = self.relay_peak = self.server_peak = 0
        self.max_connections = 0
        self.peak_by = ""  # the run's peak by application_name
        self._engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-connections")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._engine.dispose()

    def _run(self) -> None:
        count = text(
            "SELECT datname LIKE :prefix, application_name, count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' GROUP BY 1, 2"
        )
        with _connect(self._engine) as conn:
            self.max_connections = int(conn.execute(text("SHOW max_connections")).scalar_one())
            while not self._stop.wait(0.2):
                rows = conn.execute(count, {"prefix": f"{self.prefix}%"}).all()
                ours = {name or "-": int(n) for mine, name, n in rows if mine}
                if sum(ours.values()) > self.peak:
                    self.peak = sum(ours.values())
                    self.peak_by = ", ".join(f"{k} {v}" for k, v in sorted(ours.items()))
                relay = sum(n for name, n in ours.items() if name != WRITER)
                self.relay_peak = max(self.relay_peak, relay)
                self.server_peak = max(self.server_peak, sum(int(n) for _, _, n in rows))


def _readyz(port: int) -> str:
    """The databases' states /readyz gives, the cut one's in full."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            body = answer.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except OSError as exc:
        return f"unreadable ({exc})"
    found = json.loads(body)
    states = found.get("databases", {})
    return f"{found.get('databases_ready')} ready, {CUT}: {states.get(CUT, '?')!r}"


def _dead(tenants: list[Tenant]) -> int:
    dead = 0
    for tenant in tenants:
        engine = create_engine(tenant.url, poolclass=NullPool)
        try:
            with _connect(engine) as conn:
                found = conn.execute(
                    text("SELECT count(*) FROM outbox_message WHERE state = 'dead'")
                )
                dead += int(found.scalar_one())
        finally:
            engine.dispose()
    return dead


def run_tenants(workdir: Path | None = None, seed: int = 7) -> TenantsRow:
    workdir = workdir or Path(os.environ.get("TMPDIR", "/tmp"))
    rng = random.Random(seed)
    suffix = uuid.uuid4().hex[:8]
    exchange = f"chaos.{suffix}"
    queues = {"trickle": f"chaos.{suffix}.trickle", "backlog": f"chaos.{suffix}.backlog"}
    spawn = multiprocessing.get_context("spawn")
    checker = DeliveryChecker()
    out: Queue[Any] = spawn.Queue()
    ledger = Ledger(checker, out)
    stop_writers, stop_consumers = spawn.Event(), spawn.Event()
    begin, go = spawn.Event(), spawn.Event()  # the trickle's start, the backlog's
    processes: list[multiprocessing.process.BaseProcess] = []
    with contextlib.ExitStack() as stack:
        tenants = stack.enter_context(databases(suffix, workdir))
        proxy = stack.enter_context(TcpProxy("127.0.0.1", 5432))
        stack.enter_context(topology(exchange, queues))
        tenants = [
            dataclasses.replace(t, relay_url=proxy.url_for(t.url, 5432) if t.name == CUT else t.url)
            for t in tenants
        ]
        by_name = {t.name: t for t in tenants}
        db_file = workdir / f"chaos-tenants-{suffix}.databases"
        stack.callback(db_file.unlink, missing_ok=True)
        lines = [f"# {NAME}", ""]
        lines += [f"{t.name} = {t.relay_url}" if t.named else t.relay_url for t in tenants]
        db_file.write_text("\n".join(lines) + "\n")
        migrated = subprocess.run(
            [sys.executable, "-m", "relay", "--db-file", str(db_file), "migrate"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if migrated.returncode != 0:
            raise RuntimeError(f"{NAME}: migrate --db-file failed: {migrated.stderr[-2000:]}")

        ledger.start()
        stack.callback(ledger.stop)
        watch = ConnectionWatch(f"chaos_{suffix}_")
        watch.start()
        stack.callback(watch.stop)

        def stop_processes() -> None:
            stop_writers.set()
            stop_consumers.set()
            begin.set()
            go.set()
            for p in processes:
                p.join(20)
                if p.is_alive():
                    p.kill()
                    p.join(5)

        stack.callback(stop_processes)
        ready = {name: spawn.Event() for name in queues}
        for routing_key, name in queues.items():
            processes.append(
                spawn.Process(target=consume, args=(name, out, stop_consumers, ready[routing_key]),
                              daemon=True)
            )  # fmt: skip
        behind = by_name[BEHIND]
        processes.append(
            spawn.Process(
                target=backlog,
                args=(BEHIND, behind.url, exchange, BACKLOG, BACKLOG_TRANSACTIONS, go, out),
                daemon=True,
            )
        )
        groups: dict[str, list[tuple[str, str | None]]] = {}
        for t in tenants:
            if t.name != BEHIND:
                groups.setdefault(t.database_url or t.url, []).append((t.name, t.schema))
        trickled = list(groups.items())
        writer = spawn.Process(
            target=trickle, args=(trickled, exchange, TRICKLE_RATE, out, begin, stop_writers),
            daemon=True,
        )  # fmt: skip
        processes.append(writer)
        for p in processes:
            p.start()
        for event in ready.values():
            if not event.wait(60):
                raise RuntimeError(f"{NAME}: a consumer did not start")

        log = workdir / f"chaos-many-databases-{suffix}.log"
        http_port = free_port()
        relay = FileRelay(db_file, log, [*FLAGS, "--http-port", str(http_port)])
        relay.start()
        stack.callback(relay.stop)
        ledger.wait(lambda: relay.started() >= set(by_name), 60, "every database's loop started")
        print(f"chaos:   {len(tenants)} databases served (log {log})", flush=True)

        # A: the trickle alone.
        begin.set()
        assert relay.process is not None
        a_start = time.time() + WARM_UP
        time.sleep(WARM_UP)
        cpu_a = _cpu_seconds(relay.process.pid)
        time.sleep(PHASE_A - WARM_UP)
        a_end = time.time()
        relay_cpu_a = (_cpu_seconds(relay.process.pid) - cpu_a) / (PHASE_A - WARM_UP)

        # B: the backlog, the trickle going on; the cut during it.
        cpu_at_go, go_at = _cpu_seconds(relay.process.pid), time.monotonic()
        go.set()
        ledger.wait(lambda: bool(ledger.backlog_commits), 120, "the backlog's first commit")
        b_start = ledger.backlog_commits[0]
        time.sleep(max(0.0, b_start + CUT_AFTER - time.time()))
        proxy.cut()
        cut_at = time.time()
        time.sleep(CUT_DOWN / 2)
        readyz = _readyz(http_port)
        time.sleep(max(0.0, cut_at + CUT_DOWN - time.time()))
        proxy.restore()
        restored = time.time()
        before_restore = ledger.trickle_ids(0.0, restored, only=CUT)
        catch_up: float | None = None  # not within 120 s: the row fails, the run goes on
        if ledger.reached(lambda: ledger.arrived(before_restore), 120, "the cut's catch-up"):
            catch_up = max(0.0, ledger.last_arrival(before_restore) - restored)
        cut_written = len(ledger.trickle_ids(cut_at, restored, only=CUT))
        # Not within 180 s: what is missing shows as lost, and the run goes on.
        drained = ledger.reached(
            lambda: len(ledger.backlog_ids) == BACKLOG and ledger.arrived(ledger.backlog_ids),
            180, "the backlog's drain",
        )  # fmt: skip
        b_end = ledger.last_arrival(ledger.backlog_ids) if drained else time.time()
        relay_cpu_b = (_cpu_seconds(relay.process.pid) - cpu_at_go) / (time.monotonic() - go_at)
        load_b = os.getloadavg()[0]

        # C: SIGKILLs, the trickle going on.
        c_start = time.time()
        for _ in range(KILLS):
            time.sleep(rng.uniform(*KILL_BETWEEN))
            relay.kill()
            relay.start()
        last_start = time.time()
        time.sleep(AFTER_KILLS)
        stop_writers.set()
        writer.join(30)
        c_end = time.time()
        ledger.wait(lambda: "trickle" in ledger.done, 30, "the writers' end")

        def settled() -> bool:
            relay.ensure_running()  # as an orchestrator would, should it have exited
            return checker.all_received()

        ledger.reached(settled, 180, "every message's arrival")  # else: lost, in the table
        time.sleep(1.0)  # a late duplicate would show up now
        relay.stop()
        committed_at = dict(ledger.committed_at)
        before_last = [i for i, at in committed_at.items() if at < last_start]
        recovered = max(0.0, ledger.last_arrival(before_last) - last_start)

        relay_log = log.read_text(errors="replace")
        kinds = {t.name: t.kind for t in tenants}
        figures = Figures(
            a=ledger.latency(ledger.trickle_ids(a_start, a_end), kinds),
            b=ledger.latency(ledger.trickle_ids(b_start, b_end, but=CUT), kinds),
            c=ledger.latency(ledger.trickle_ids(c_start, c_end)),
            backlog_s=b_end - b_start,
            drained=drained,
            cut_written=cut_written,
            catch_up_s=catch_up,
            readyz=readyz,
            peak_connections=watch.peak,
            peak_by=watch.peak_by,
            relay_connections=watch.relay_peak,
            server_connections=watch.server_peak,
            max_connections=watch.max_connections,
            refused=relay_log.count("too many clients"),
            relay_cpu_a=relay_cpu_a,
            relay_cpu_b=relay_cpu_b,
            load_b=load_b,
            tracebacks=relay_log.count("Traceback"),
            starts=relay.starts,
            errors=tuple(ledger.errors[:5]),
        )
        return TenantsRow(
            NAME,
            checker.report(),
            recovered,
            innocent_dead=_dead(tenants),
            connections_lost=relay_log.count("broker.lost"),
            figures=figures,
        )
    raise AssertionError("unreachable")  # the ExitStack does not swallow exceptions


def note(row: TenantsRow) -> str:
    """The figures the table's columns do not hold."""
    f = row.figures
    if f is None:
        return f"{row.fault}: no figures"
    catch_up = "never" if f.catch_up_s is None else f"{f.catch_up_s:.1f} s"
    errors = f"; writers' errors: {'; '.join(f.errors)}" if f.errors else ""
    drain = (
        f"{f.backlog_s:.1f} s from its first commit to its last arrival "
        f"({BACKLOG / f.backlog_s:,.0f} msg/s"
        if f.drained
        else f"NOT drained {f.backlog_s:.0f} s after its first commit (lost: see the table"
    )
    return (
        f"{row.fault}: {SQLITE} SQLite, {PG_DATABASES} PostgreSQL databases, {PG_SCHEMAS} schemas, "
        f"one relay (--db-file); trickle {TRICKLE_RATE:g}/s on each of 19, commit to consume: "
        f"A {f.a}; B (while {BACKLOG:,} drained from '{BEHIND}', '{CUT}' left out) {f.b}; "
        f"B/A p50 {f.ratio:.2f} (limit {MAX_RATIO:g}); C ({KILLS} SIGKILLs) {f.c}. "
        f"Backlog: {drain}; the relay used {f.relay_cpu_b:.2f} CPU meanwhile, "
        f"{f.relay_cpu_a:.2f} in A; load average {f.load_b:.1f} on {os.cpu_count()} CPUs). "
        f"'{CUT}' cut {CUT_DOWN:g} s, "
        f"{f.cut_written} committed meanwhile, /readyz then: {f.readyz}; all arrived "
        f"{catch_up} after the restore (limit {MAX_CATCH_UP:g} s). "
        f"Duplicates {row.report.duplicated:,}. PostgreSQL connections at the most: "
        f"{f.peak_connections} to the run's databases ({f.peak_by}), the relay's own peak "
        f"{f.relay_connections}; {f.server_connections} of {f.max_connections} on the server "
        f"(other work shares it); 'too many clients' {f.refused} times in the relay's log. "
        f"The relay started {f.starts} times; {f.tracebacks} tracebacks in its log"
        f"{errors}"
    )


if __name__ == "__main__":
    result = run_tenants()
    print(table([result]))
    print(note(result))
    sys.exit(0 if result.ok else 1)
