"""Chaos scenarios: applications commit keyed messages while a real fault hits the relay; the
delivery checker then counts lost, unexpected, duplicated and out-of-order messages.

Every scenario runs on its own PostgreSQL schema (or MariaDB database), exchange and queue
(removed afterwards), with
`outbox-relay run` as a real subprocess, a consumer reading the real broker, and faults injected for
real: SIGKILL, a TCP proxy that cuts or slows connections, `rabbitmqctl`.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
from sqlalchemy import Engine, bindparam, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import outbox
from outbox import config as outbox_config
from outbox.schema import UUID, message
from relay.capture import admin as capture
from tests.chaos import recovery
from tests.chaos.checker import DeliveryChecker, Report
from tests.support.proxy import TcpProxy

PG_URL = os.environ.get("OUTBOX_TEST_PG_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("OUTBOX_TEST_MYSQL_URL", "mariadb+pymysql://root@127.0.0.1:3306/test")
# "logical": PostgreSQL with `run --capture logical`, a database of its own (a slot reads a
# whole database) whose writers emit their messages into the log.
DATABASES = ("postgresql", "mariadb", "logical")
AMQP_URL = os.environ.get("OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
ROOT = Path(__file__).resolve().parents[2]
# Short leases and confirm timeouts, so a killed relay's rows come back within seconds.
RELAY_FLAGS = ["--lease", "6", "--confirm-timeout", "3", "--poll-interval", "0.05",
               "--drain-timeout", "5", "--no-listen"]  # fmt: skip


@dataclass
class Row:
    fault: str
    report: Report
    # From the end of the last fault until every message committed before it had arrived: how
    # long the relay took to catch up with what the fault held back.
    recovery_s: float
    innocent_dead: int = 0  # rows the writers committed that ended dead
    connections_lost: int = 0  # broker.lost in the relay's log
    steady_connection: bool = False  # the fault must not cost the relay its broker connection
    poisoned: int = 0  # rows spoiled by the fault (never to be delivered)
    poison_dead: int = 0  # of those, how many ended dead
    held_at_kill: int | None = None  # kill mid-drain: rows the killed relay held in flight
    keys: Keys | None = None  # hot keys: how the traffic was spread over keys
    hot_backlog: int = 0  # hot keys: the most messages seen waiting behind one of them
    kills_in_flight: tuple[int, ...] = ()  # kill mid-run: hot keys' rows each killed relay held
    # What the recovery was made of, and the backlog's drain time at full speed (calibrated runs).
    timeline: recovery.Timeline | None = None

    @property
    def ok(self) -> bool:
        lost_connection = self.steady_connection and self.connections_lost > 0
        return self.report.ok and self.innocent_dead == 0 and not lost_connection


# --------------------------------------------------------------------------- parts


def relay_flags(db_url: str, database: str, flags: Sequence[str] = RELAY_FLAGS) -> list[str]:
    """`flags`, and with logical capture the slot to read (named after the database)."""
    if database != "logical":
        return list(flags)
    slot = make_url(db_url).database
    assert slot is not None
    return [*flags, "--capture", "logical", "--capture-slot", slot]


def _schema_url(schema: str) -> str:
    options = urllib.parse.quote(f"-csearch_path={schema}")
    return f"{PG_URL}?options={options}"


class Relay:
    """`outbox-relay run` as a subprocess, started and killed at will (with `flags`: RELAY_FLAGS
    unless given)."""

    def __init__(
        self, db_url: str, amqp_url: str, log: Path, flags: Sequence[str] = RELAY_FLAGS
    ) -> None:
        self.argv = [sys.executable, "-m", "relay", "--db", db_url, "--amqp", amqp_url, "run",
                     *flags]  # fmt: skip
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "OTEL_"))}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log
            )
        self.starts += 1

    def ensure_running(self) -> None:
        """Start the relay again if it has exited (as an orchestrator would)."""
        if self.process is None or self.process.poll() is not None:
            self.start()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class Consumer:
    """Reads the queue with manual acks and reports each delivery; reconnects if the broker goes.
    With `auto_ack` the broker does not wait for acks: faster, for a fault that leaves the broker
    alone (a delivery in flight when the connection drops would look lost)."""

    def __init__(self, queue: str, checker: DeliveryChecker, *, auto_ack: bool = False) -> None:
        self.queue = queue
        self.checker = checker
        self.auto_ack = auto_ack
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-consumer")
        self.connects: list[float] = []  # when it connected: twice, the broker dropped it

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
            except pika.exceptions.AMQPError:
                time.sleep(0.5)
                continue
            self.connects.append(time.monotonic())
            try:
                channel = conn.channel()
                channel.basic_qos(prefetch_count=1000)

                def on_message(ch: Any, method: Any, props: Any, _body: bytes) -> None:
                    self.checker.received(props.message_id)
                    if not self.auto_ack:
                        ch.basic_ack(method.delivery_tag)

                channel.basic_consume(self.queue, on_message, auto_ack=self.auto_ack)
                while not self._stop.is_set():
                    conn.process_data_events(time_limit=0.1)
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.5)  # the broker went away: connect again


@dataclass(frozen=True)
class Keys:
    """How the writers spread their messages over ordering keys: the `hot` keys carry `hot_share`
    of all messages between them, each written by a writer thread of its own at its part of the
    rate; the rest go round the `cold` keys, which the usual writers share out as before."""

    cold: int = 200
    hot: int = 0
    hot_share: float = 0.0

    def __post_init__(self) -> None:
        if self.cold < 1 or self.hot < 0 or not 0.0 <= self.hot_share < 1.0:
            raise ValueError(f"bad key mix {self}")
        if (self.hot == 0) != (self.hot_share == 0.0):
            raise ValueError(f"hot keys and their share go together: {self}")

    @property
    def hot_names(self) -> list[str]:
        return [f"hot{h}" for h in range(self.hot)]


RATE = 1000.0  # messages/s the writers commit in all, unless a scenario says otherwise
UNIFORM = Keys()
# 3 keys with 80% of the traffic, at HOT_RATE: 160 messages/s each. A hot key is sent one
# message per broker confirm, and beside a run's writers, consumer and checker it must still
# drain well above the rate it is written at, or a fault's backlog would never be caught up
# (at RATE each hot key would get 267/s). At 160/s a 4 s broker cut leaves ~800 behind each,
# drained within seconds of the relay's return.
HOT = Keys(hot=3, hot_share=0.8)
HOT_RATE = 600.0


@dataclass(frozen=True)
class _Plan:
    keys: list[str]  # this writer's keys (no other writer has any of them), taken in turn
    count: int  # transactions (committed and rolled back)
    pause: float  # seconds between them: this writer's share of the rate


class Writers:
    """Application threads committing one keyed message per transaction; each key belongs to one
    writer, so a key's commit order is its enqueue order. Every `rollback_every`th transaction
    rolls back (its message must never arrive). With hot keys (`keys`), each hot key has a writer
    of its own, paced at its share of the traffic, beside the `writers` that share the cold
    keys."""

    def __init__(
        self, engine: Engine, exchange: str, checker: DeliveryChecker, *, total: int,
        writers: int = 4, keys: Keys = UNIFORM, rollback_every: int = 25, rate: float = RATE,
    ) -> None:  # fmt: skip
        self.engine, self.exchange, self.checker = engine, exchange, checker
        self.total, self.keys = total, keys
        self.rollback_every = rollback_every
        # Each writer's share of the rate paces it, so the traffic spans the faults.
        hot_total = round(total * keys.hot_share)
        cold_rate = rate * (1.0 - keys.hot_share)
        self.plans = [
            _Plan([f"k{k}" for k in range(keys.cold) if k % writers == w],
                  (total - hot_total) // writers, writers / cold_rate)
            for w in range(writers)
        ] + [
            _Plan([name], hot_total // keys.hot, keys.hot / (rate * keys.hot_share))
            for name in keys.hot_names
        ]  # fmt: skip
        self._threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True)
            for w in range(len(self.plans))
        ]
        self.errors: list[str] = []
        self._go = threading.Event()  # cleared while a fault holds the writers
        self._go.set()
        self._writing = threading.Semaphore(len(self.plans))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        for t in self._threads:
            t.join()

    @property
    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No transaction starts until the block ends; those under way finish first."""
        self._go.clear()
        taken = 0
        try:
            for _ in range(len(self.plans)):
                self._writing.acquire()
                taken += 1
            yield
        finally:
            for _ in range(taken):
                self._writing.release()
            self._go.set()

    def _write(self, w: int) -> None:
        plan = self.plans[w]
        next_at = time.monotonic()
        for n in range(plan.count):
            next_at += plan.pause
            time.sleep(max(0.0, next_at - time.monotonic()))
            key = plan.keys[n % len(plan.keys)]
            rollback = n % self.rollback_every == self.rollback_every - 1
            self._go.wait()
            try:
                with self._writing, Session(self.engine) as session, session.begin() as tx:
                    message_id = str(
                        outbox.enqueue(
                            session,
                            exchange=self.exchange,
                            routing_key="chaos",
                            payload={"n": n, "w": w},
                            key=key,
                        )
                    )
                    if rollback:
                        tx.rollback()
                if rollback:
                    self.checker.rolled_back(message_id)
                else:
                    self.checker.committed(message_id, key)
            except Exception as exc:
                self.errors.append(repr(exc))


class BacklogWatch:
    """Samples, every `every` seconds, how many messages wait behind each of `keys` (committed,
    not yet arrived in order: checker.backlog) and keeps the largest: whether a fault really
    held a hot key back by more than one run."""

    def __init__(self, checker: DeliveryChecker, keys: Sequence[str], every: float = 0.05) -> None:
        self.checker, self.keys, self.every = checker, list(keys), every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-backlog")

    def start(self) -> None:
        if self.keys:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for key in self.keys:
                self.peak = max(self.peak, self.checker.backlog(key))


def settle(
    checker: DeliveryChecker, relay: Relay, writers: Writers, timeout: float, *, late: float
) -> tuple[recovery.Return, float]:
    """Once a fault has ended: wait for what waited at its end, then for the writers and the
    rest (within `timeout` of the fault's end), then `late` seconds more for a late duplicate.
    Returns what waited at the fault's end, and the seconds until it had all arrived. A fault may
    have left the relay dead (a cut during its start makes `run` exit 1): a deployment restarts
    it, whenever it exits, and so does this."""
    back = recovery.returned(checker)
    held_back = set(back.held_back)
    deadline = back.at + timeout
    while not checker.all_received(held_back) and time.monotonic() < deadline:
        relay.ensure_running()
        time.sleep(0.05)
    recovered = time.monotonic() - back.at
    writers.join()
    while not checker.all_received() and time.monotonic() < deadline:
        relay.ensure_running()
        time.sleep(0.1)
    time.sleep(late)
    return back, recovered


@contextlib.contextmanager
def topology(exchange: str, queues: Mapping[str, str]) -> Iterator[None]:
    """A topic exchange and a durable queue for each binding key (`queues`: key -> queue),
    deleted at the end. A connection per step: one left idle through a scenario would be closed
    by the broker (missed heartbeats, or the broker-restart fault) and could not clean up."""
    conn_amqp = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = conn_amqp.channel()
        channel.exchange_declare(exchange, "topic", durable=True)
        for binding, name in queues.items():
            channel.queue_declare(name, durable=True)
            channel.queue_bind(name, exchange, binding)
    finally:
        conn_amqp.close()
    try:
        yield
    finally:
        cleanup = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        try:
            channel = cleanup.channel()
            for name in queues.values():
                channel.queue_delete(name)
            channel.exchange_delete(exchange)
        finally:
            cleanup.close()


@contextlib.contextmanager
def environment(name: str, database: str = "postgresql") -> Iterator[tuple[str, Engine, str, str]]:
    """A schema (on MariaDB, and with logical capture, a database; migrated), an exchange and a
    queue of this run; all removed afterwards. With logical capture the database has its slot,
    and this process's enqueues emit into the log for it."""
    suffix = uuid.uuid4().hex[:10]
    schema, exchange, queue = f"chaos_{suffix}", f"chaos.{suffix}", f"chaos.{suffix}.q"
    mariadb, logical = database == "mariadb", database == "logical"
    # Pre-ping: a fault may restart the database under this pooled connection too.
    admin = create_engine(
        MYSQL_URL if mariadb else PG_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True
    )
    with admin.connect() as conn:
        if mariadb:
            conn.execute(text(f"CREATE DATABASE `{schema}` CHARACTER SET utf8mb4"))
        elif logical:
            conn.execute(text(f'CREATE DATABASE "{schema}"'))
        else:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    if mariadb:
        url = make_url(MYSQL_URL).set(database=schema).render_as_string(hide_password=False)
    elif logical:
        url = make_url(PG_URL).set(database=schema).render_as_string(hide_password=False)
    else:
        url = _schema_url(schema)
    # Pre-ping: a fault may restart the database under the writers' pooled connections.
    engine = create_engine(url, pool_size=8, pool_pre_ping=True)
    outbox.create_schema(engine)
    if logical:
        capture.setup(engine, slot=schema, publication=schema)
        outbox.configure(capture="logical", capture_slot=schema)
    try:
        with topology(exchange, {"#": queue}):
            yield url, engine, exchange, queue
    finally:
        if logical:
            outbox_config.reset()
            with contextlib.suppress(Exception):  # the database goes anyway
                _let_go(engine, schema)
                capture.drop(engine, slot=schema, publication=schema)
        engine.dispose()
        with admin.connect() as conn:
            if mariadb:
                conn.execute(text(f"DROP DATABASE `{schema}`"))
            elif logical:
                conn.execute(text(f'DROP DATABASE "{schema}" WITH (FORCE)'))
            else:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _let_go(engine: Engine, slot: str, timeout: float = 20.0) -> None:
    """Wait for the relays to let the slot go (a killed one's walsender ends with its socket)."""
    deadline = time.monotonic() + timeout
    while capture.slot_state(engine, slot, publication=slot).active:
        if time.monotonic() > deadline:
            raise RuntimeError(f"slot {slot} still read {timeout:g} s after the relays stopped")
        time.sleep(0.1)


# --------------------------------------------------------------------------- scenarios


@dataclass
class Context:
    relay: Relay
    broker_proxy: TcpProxy | None = None
    db_proxy: TcpProxy | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    writers: Writers | None = None
    engine: Engine | None = None
    exchange: str = ""
    queue: str = ""
    poisoned: set[str] = field(default_factory=set)  # ids of rows a fault spoiled
    database: str = "postgresql"
    kills_in_flight: list[int] = field(default_factory=list)  # kill_mid_run: what each held


Fault = Callable[[Context], None]


def run(
    name: str, fault: Fault, *, messages: int, rate: float = RATE, proxy_broker: bool = False,
    proxy_db: bool = False, settle_timeout: float = 120.0, workdir: Path | None = None,
    steady_connection: bool = False, database: str = "postgresql", keys: Keys = UNIFORM,
    calibrate: int = 0,
) -> Row:  # fmt: skip
    """One fault's run. With `calibrate`, that many messages are committed before the relay
    starts and drained at full speed before the fault (tests/chaos/recovery.py)."""
    checker = DeliveryChecker()
    workdir = workdir or Path(os.environ.get("TMPDIR", "/tmp"))
    with environment(name, database) as (db_url, engine, exchange, queue):
        broker_proxy = TcpProxy("127.0.0.1", 5672) if proxy_broker else None
        db_port = 3306 if database == "mariadb" else 5432
        db_proxy = TcpProxy("127.0.0.1", db_port) if proxy_db else None
        relay_db = db_proxy.url_for(db_url, db_port) if db_proxy else db_url
        relay_amqp = broker_proxy.url_for(AMQP_URL, 5672) if broker_proxy else AMQP_URL
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        log = workdir / f"chaos-{slug}-{uuid.uuid4().hex[:6]}.log"
        relay = Relay(relay_db, relay_amqp, log, relay_flags(db_url, database))
        consumer = Consumer(queue, checker)
        consumer.start()
        writers = Writers(engine, exchange, checker, total=messages, rate=rate, keys=keys)
        backlog = BacklogWatch(checker, keys.hot_names)
        ctx = Context(
            relay, broker_proxy, db_proxy, writers=writers, engine=engine, exchange=exchange,
            queue=queue, database=database,
        )  # fmt: skip
        cold = [f"k{k}" for k in range(keys.cold)]
        shape = recovery.calibration_keys(calibrate, cold, keys.hot_names, keys.hot_share)
        calibration = recovery.write_calibration(engine, exchange, checker, shape)
        relay.start()
        writers.start()
        backlog.start()
        speed: recovery.Speed | None = None  # the calibration's
        try:
            if calibration:
                speed = recovery.full_speed(checker, calibration, settle_timeout)
            fault(ctx)
            # A late duplicate or a leaked rollback would show up within half a second.
            back, recovered = settle(checker, relay, writers, settle_timeout, late=0.5)
        finally:
            backlog.stop()
            relay.stop()
            consumer.stop()
            for proxy in (broker_proxy, db_proxy):
                if proxy is not None:
                    proxy.close()
        if writers.errors:
            raise RuntimeError(f"{name}: writers failed: {writers.errors[:3]}")
        with engine.connect() as conn:
            dead = {
                str(uuid.UUID(str(i)))
                for (i,) in conn.execute(text("SELECT id FROM outbox_message WHERE state = 'dead'"))
            }
        return Row(
            f"{name} ({database})" if database != "postgresql" else name,
            checker.report(),
            recovered,
            innocent_dead=len(dead - ctx.poisoned),
            connections_lost=relay.log.read_text(errors="replace").count("broker.lost"),
            steady_connection=steady_connection,
            poisoned=len(ctx.poisoned),
            poison_dead=len(dead & ctx.poisoned),
            keys=keys if keys.hot else None,
            hot_backlog=backlog.peak,
            kills_in_flight=tuple(ctx.kills_in_flight),
            timeline=recovery.timeline(back, checker, speed, relay.log, consumer.connects),
        )


def one_after_another(*faults: Fault) -> Fault:
    """Each fault in turn."""

    def fault(ctx: Context) -> None:
        for each in faults:
            each(ctx)

    return fault


def kill_relay(kills: int, between: tuple[float, float] = (0.3, 1.5)) -> Fault:
    """SIGKILL the relay at random moments, again and again, restarting it each time."""

    def fault(ctx: Context) -> None:
        for _ in range(kills):
            time.sleep(ctx.rng.uniform(*between))
            ctx.relay.kill()
            ctx.relay.start()

    return fault


def _hot_in_flight(engine: Engine, relay_id: str, hot: list[str]) -> int:
    """The hot keys' rows relay `relay_id` holds in flight (its id is the default, HOSTNAME:PID)."""
    m = message.c
    held = select(func.count()).where(
        m.state == "in_flight", m.lease_owner == relay_id, m.key.in_(hot)
    )
    with engine.connect() as conn:
        return int(conn.execute(held).scalar_one())


def kill_mid_run(
    kills: int, between: tuple[float, float], rows: int = 100, wait: float = 15.0
) -> Fault:
    """SIGKILL the relay `kills` times, restarting it each time: each kill after a pause of
    `between` seconds, then once the relay holds at least `rows` messages of the hot keys in
    flight (its runs: the kill lands in the middle of their chains) or `wait` seconds have
    passed, then up to 0.25 s more (less than a run of 128 takes to publish), so it hits any
    part of a chain. What each killed relay held is in ctx.kills_in_flight."""

    def fault(ctx: Context) -> None:
        assert ctx.engine is not None
        assert ctx.writers is not None
        hot = ctx.writers.keys.hot_names
        for _ in range(kills):
            time.sleep(ctx.rng.uniform(*between))
            process = ctx.relay.process
            assert process is not None
            relay_id = f"{socket.gethostname()}:{process.pid}"
            deadline = time.monotonic() + wait
            while _hot_in_flight(ctx.engine, relay_id, hot) < rows:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            time.sleep(ctx.rng.uniform(0.0, 0.25))
            ctx.relay.kill()
            # Its rows stay in flight until a relay takes them back (3 s): all there to count.
            ctx.kills_in_flight.append(_hot_in_flight(ctx.engine, relay_id, hot))
            ctx.relay.start()

    return fault


def running(relay: Relay, timeout: float = 60.0) -> None:
    """Wait until the relay's latest start has logged relay.started: it has connected to the
    broker and the database and is relaying (a fault before that would cut nothing)."""
    deadline = time.monotonic() + timeout
    while relay.log.read_text(errors="replace").count("relay.started") < relay.starts:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the relay did not start: see {relay.log}")
        relay.ensure_running()
        time.sleep(0.05)


def cut(proxy: str, times: int, down: float = 2.0, up: float = 1.0) -> Fault:
    """Cut the relay's broker or database connection for `down` seconds, `times` times, once
    the relay is running."""

    def fault(ctx: Context) -> None:
        target = ctx.broker_proxy if proxy == "broker" else ctx.db_proxy
        assert target is not None
        running(ctx.relay)
        for _ in range(times):
            time.sleep(up)
            target.cut()
            time.sleep(down)
            target.restore()

    return fault


def slow_broker(latency: float, seconds: float) -> Fault:
    def fault(ctx: Context) -> None:
        assert ctx.broker_proxy is not None
        ctx.broker_proxy.latency = latency
        time.sleep(seconds)
        ctx.broker_proxy.latency = 0.0

    return fault


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=120)


def restart_broker(times: int, down: float = 3.0) -> Fault:
    """`rabbitmqctl stop_app` / `start_app` (make chaos only: it affects the whole broker)."""

    def fault(ctx: Context) -> None:
        for _ in range(times):
            time.sleep(1.5)
            _rabbitmqctl("stop_app")
            time.sleep(down)
            _rabbitmqctl("start_app")
            _rabbitmqctl("await_startup")

    return fault


def restart_postgres(times: int, down: float = 2.0) -> Fault:
    """Stop PostgreSQL (fast: sessions and the relay's stream end) and start it again, the
    writers held meanwhile (a commit cut short would leave its outcome unknown). make chaos
    only: it restarts the machine's cluster."""

    def fault(ctx: Context) -> None:
        assert ctx.writers is not None
        running(ctx.relay)
        cluster = sorted(os.listdir("/etc/postgresql"))[0]
        for _ in range(times):
            time.sleep(3.0)
            with ctx.writers.held():
                for action in ("stop", "start"):
                    subprocess.run(
                        ["pg_ctlcluster", "--skip-systemctl-redirect", cluster, "main", action,
                         *(["-m", "fast"] if action == "stop" else [])],
                        check=True, capture_output=True, timeout=120,
                    )  # fmt: skip
                    if action == "stop":
                        time.sleep(down)

    return fault


def unroutable(seconds: float) -> Fault:
    """Unbind the queue for `seconds`: what is published meanwhile is unroutable (deferred
    through the grace period), then it routes again and everything arrives, in key order."""

    def fault(ctx: Context) -> None:
        running(ctx.relay)
        time.sleep(2.0)
        conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        try:
            channel = conn.channel()
            channel.queue_unbind(ctx.queue, ctx.exchange, "#")
            time.sleep(seconds)
            channel.queue_bind(ctx.queue, ctx.exchange, "#")
        finally:
            conn.close()

    return fault


def memory_alarm(seconds: float) -> Fault:
    """A memory alarm blocks every publisher (make chaos only), then the watermark is restored."""

    def fault(_ctx: Context) -> None:
        time.sleep(1.0)
        _rabbitmqctl("set_vm_memory_high_watermark", "0.000001")
        try:
            time.sleep(seconds)
        finally:
            _rabbitmqctl("set_vm_memory_high_watermark", "0.4")

    return fault


# What a hand-edited or foreign row may hold (PostgreSQL columns keep their types, so these are
# values of the right type the wire cannot carry): (column, SQL expression of :value, value).
# MariaDB keeps JSON as checked text: the same values as they are, but the first (MariaDB's
# json_valid refuses nesting deeper than 32, so no such row can exist there).
POISON: list[tuple[str, str, str]] = [
    ("headers", "CAST(:value AS json)", "[" * 5000 + "]" * 5000),  # RecursionError to json.loads
    ("headers", "CAST(:value AS json)", '{"n": 1e400}'),  # infinity
    ("headers", "CAST(:value AS json)", '{"big": "' + "x" * 140_000 + '"}'),  # over frame_max
    ("headers", "CAST(:value AS json)", '{"big": "' + "x" * 40_000 + '", "n": null}'),
    ("headers", "CAST(:value AS json)", '{"' + "h" * 300 + '": 1}'),  # name over 255 bytes
    ("headers", "CAST(:value AS json)", "[1, 2]"),  # not an object
    ("content_type", ":value", "é" * 200),  # 400 bytes: over AMQP's shortstr
    ("routing_key", ":value", "é" * 200),
]


def poison_rows(count: int, every: float) -> Fault:
    """Commit rows spoiled by raw SQL while the writers run: each must end dead on its own,
    without costing the relay its connection or any other message anything."""

    def fault(ctx: Context) -> None:
        assert ctx.engine is not None
        mariadb = ctx.database == "mariadb"
        poison = [(c, ":value" if mariadb else e, v) for c, e, v in POISON[mariadb:]]
        for n in range(count):
            time.sleep(every)
            column, expression, value = poison[n % len(poison)]
            with ctx.engine.begin() as conn:  # one transaction: never seen unspoiled
                message_id = outbox.enqueue(
                    conn,
                    exchange=ctx.exchange,
                    routing_key="chaos",
                    payload={"poison": n},
                    key=f"poison-{n}" if n % 2 else None,  # its own key: it holds no writer's
                )
                spoil = text(f"UPDATE outbox_message SET {column} = {expression} WHERE id = :id")
                conn.execute(
                    spoil.bindparams(bindparam("id", type_=UUID)),
                    {"id": message_id, "value": value},
                )
            ctx.poisoned.add(str(message_id))

    return fault


def hot_note(row: Row) -> str | None:
    """What the table's columns do not say about a hot-key run, or None for any other."""
    if row.keys is None:
        return None
    kills = ""
    if row.kills_in_flight:
        held = ", ".join(str(n) for n in row.kills_in_flight)
        kills = f"; the relays killed held {held} of their messages in flight"
    return (
        f"{row.fault}: {row.keys.hot} hot keys carried {row.keys.hot_share:.0%} of the "
        f"messages; at most {row.hot_backlog:,} waited behind one of them{kills}"
    )


def _full_speed(row: Row) -> tuple[str, str]:
    """The fault's backlog's drain time at the run's full speed, and the recovery beyond it, or
    - (not calibrated)."""
    full = row.timeline.full_speed_s if row.timeline is not None else None
    if full is None:
        return "-", "-"
    return f"{full:.1f} s", f"{row.recovery_s - full:+.1f} s"


def table(rows: list[Row]) -> str:
    header = ["fault", "messages", "lost", "unexpected", "duplicated", "out of order",
              "innocent dead", "conn lost", "poison dead", "recovery",
              "full-speed drain", "beyond it"]  # fmt: skip
    body = [
        [r.fault, f"{r.report.committed:,}", str(r.report.lost), str(r.report.unexpected),
         str(r.report.duplicated), str(r.report.out_of_order), str(r.innocent_dead),
         str(r.connections_lost), f"{r.poison_dead}/{r.poisoned}" if r.poisoned else "-",
         f"{r.recovery_s:.1f} s", *_full_speed(r)]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
